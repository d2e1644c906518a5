"""Engine arguments are checked against the variant interpreter's own vLLM before any
engine starts (evalpipe/config/engine_args.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from in_process import evalpipe

from evalpipe.config import engine_args as ea
from evalpipe.install import default_config

KNOWN = {"max_num_seqs", "max_model_len", "enforce_eager", "hf_overrides", "additional_config"}


def test_closest_name():
    assert ea.closest("max_num_seq", KNOWN) == "max_num_seqs"
    assert ea.closest("enforce_eagre", KNOWN) == "enforce_eager"
    assert ea.closest("additional_configs", KNOWN) == "additional_config"
    assert ea.closest("completely_unrelated", KNOWN) is None


def test_unknown_argument_is_one_sentence_with_the_variant_key_and_hint():
    ea.check_engine_args("legacy", "/venv/bin/python", {"max_num_seqs": 4, "hf_overrides": {}}, KNOWN)
    with pytest.raises(ea.EngineArgError) as err:
        ea.check_engine_args("sp", "/venv/bin/python", {"max_num_seq": 4, "enforce_eager": True}, KNOWN)
    msg = str(err.value)
    assert msg.startswith("variant `sp`: `max_num_seq` is not an engine argument of the vLLM under /venv/bin/python")
    assert "did you mean `max_num_seqs`?" in msg and "engine:" in msg and "\n" not in msg
    with pytest.raises(ea.EngineArgError, match="vllm serve --help"):
        ea.check_engine_args("sp", "/venv/bin/python", {"zzz_qqq": 1}, KNOWN)


def test_names_come_from_the_interpreters_vllm_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path))
    names = ea.known_engine_args(sys.executable)
    offline, serve = names["offline"], names["serve"]
    # EngineArgs fields, and LLM's own parameter
    assert {"max_num_seqs", "hf_overrides", "distributed_executor_backend", "enforce_eager", "chat_template"} <= offline
    assert "max_num_seq" not in offline and "self" not in offline
    # the server's flags: engine args and the server's own (host, port, api_key), not LLM's
    assert {"max_num_seqs", "hf_overrides", "data_parallel_size", "host", "port", "api_key"} <= serve
    assert "host" not in offline and "help" not in serve
    (cached,) = (tmp_path / "engine-args").glob("*.json")
    assert ea.known_engine_args(sys.executable) == names  # read back from the cache
    cached.write_text('{"names": {"offline": ["only_this"], "serve": []}}')  # the cache is what is read the second time
    assert ea.known_engine_args(sys.executable) == {"offline": {"only_this"}, "serve": set()}


def test_interpreter_without_vllm_is_refused_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path))
    base = Path(sys.base_prefix) / "bin" / "python3"
    assert base.exists() and subprocess.run([str(base), "-c", "import vllm"], capture_output=True).returncode != 0
    with pytest.raises(ea.EngineArgError, match="cannot import vllm"):
        ea.known_engine_args(str(base))


def test_run_with_a_misspelt_engine_argument_stops_before_any_engine_start(tmp_path):
    cfg = yaml.safe_load(default_config().read_text())
    cfg["variants"]["sp"]["engine"] = {"max_num_seq": 8}
    cfg["output"] = str(tmp_path / "runs")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--run-id", "t", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "variant `sp`: `max_num_seq` is not an engine argument" in out and "did you mean `max_num_seqs`?" in out
    assert "Traceback" not in out
    assert not (tmp_path / "runs" / "t").exists()  # nothing started, nothing written


def test_serve_mode_checks_the_servers_flags_and_endpoint_mode_none(monkeypatch):
    from types import SimpleNamespace

    from evalpipe.config.run_config import Launch

    monkeypatch.setattr(ea, "known_engine_args", lambda *a, **k: {"offline": {"max_num_seqs"}, "serve": {"max_num_seqs", "port"}})
    v = lambda mode, args: SimpleNamespace(name="v", python="/p", engine_args=args, process_env=dict,
                                          launch=Launch(mode=mode, url="http://h:1" if mode == "endpoint" else None))
    ea.check_plan([v("serve", {"port": 1})])
    with pytest.raises(ea.EngineArgError, match="`port` is not an engine argument"):
        ea.check_plan([v("offline", {"port": 1})])
    ea.check_plan([v("endpoint", {"anything": 1})])  # a running server: nothing is applied
