import json
import os
import subprocess
import sys

import pytest
from checkout import ROOT

from evalpipe.errors import UserError
from evalpipe.lab import training
from evalpipe.models import builtin

# A few-second build: same code path as tiny-gsm, much smaller.
TINY = {
    "tokenizer_items": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "steps": 6,
    "batch_size": 2,
    "seq_len": 128,
    "warmup_steps": 2,
    # the long-context phase, small: both probes, two lengths, GSM batches in between
    "longctx_stages": [{"steps": 5, "lr": 1e-3, "lengths": [384, 448], "probes": ["passkey", "multikey"], "tokens_per_step": 900}],
}


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("builtin")
    a = training.build("tiny-gsm", spec_overrides=TINY, out_dir=root / "a")
    b = training.build("tiny-gsm", spec_overrides=TINY, out_dir=root / "b")
    c = training.build("tiny-gsm", spec_overrides={**TINY, "seed": TINY.get("seed", 1234) + 1}, out_dir=root / "c")
    return a, b, c


def test_same_seed_gives_identical_bytes(tiny_builds):
    a, b, _ = tiny_builds
    assert a.fingerprint == b.fingerprint
    for fname in builtin.FINGERPRINT_FILES:
        assert (a.path / fname).read_bytes() == (b.path / fname).read_bytes(), fname
    assert a.fingerprint == builtin.fingerprint_dir(a.path)


def test_different_seed_gives_different_weights(tiny_builds):
    a, _, c = tiny_builds
    assert a.fingerprint != c.fingerprint
    assert (a.path / "model.safetensors").read_bytes() != (c.path / "model.safetensors").read_bytes()


def test_saved_directory_is_a_hf_model(tiny_builds):
    from transformers import AutoConfig, AutoTokenizer

    a = tiny_builds[0]
    for fname in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json", builtin.INFO_FILE):
        assert (a.path / fname).exists(), fname
    cfg = AutoConfig.from_pretrained(a.path)
    assert cfg.model_type == "llama"
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head_dim >= 32
    assert cfg.max_position_embeddings >= 4096
    tok = AutoTokenizer.from_pretrained(a.path)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert cfg.eos_token_id == tok.eos_token_id and cfg.bos_token_id == tok.bos_token_id
    assert cfg.vocab_size == len(tok)
    text = "Question: Tom has 12 apples.\nAnswer: Tom has 12 + 7 = <<12+7=19>>19 apples.\n#### 19\n\nQuestion:"
    ids = tok(text)["input_ids"]
    assert ids[0] != tok.bos_token_id  # no automatic <s>: prompts are encoded as written
    assert tok.decode(ids) == text
    # small numbers are single tokens wherever they appear (after a space, "<<", "=", ">>")
    pieces = tok.convert_ids_to_tokens(tok("Tom has 152 + 5 = <<152+5=157>>157 apples.\n#### 157")["input_ids"])
    numbers = [p.lstrip("\u0120") for p in pieces if any(ch.isdigit() for ch in p)]
    assert numbers == ["152", "5", "152", "5", "157", "157", "157"]


def test_info_file(tiny_builds):
    a = tiny_builds[0]
    info = json.loads((a.path / builtin.INFO_FILE).read_text())
    assert info["name"] == "tiny-gsm"
    assert info["fingerprint"] == a.fingerprint
    assert info["spec"]["seed"] == a.info.spec["seed"]
    assert info["spec"]["hidden_size"] == TINY["hidden_size"]
    for key in ("build_seconds", "torch_version", "final_loss"):
        assert key in info


def test_long_context_phase_trains_and_is_recorded(tiny_builds, tmp_path):
    a = tiny_builds[0]
    loss = a.info.longctx_final_loss
    assert loss is not None and 0 < loss < 50
    without = training.build("tiny-gsm", spec_overrides={**TINY, "longctx_stages": []}, out_dir=tmp_path / "plain")
    assert without.info.longctx_final_loss is None
    assert (without.path / "model.safetensors").read_bytes() != (a.path / "model.safetensors").read_bytes()
    # the tokenizer does not depend on the phase
    assert (without.path / "tokenizer.json").read_bytes() == (a.path / "tokenizer.json").read_bytes()


def test_long_context_schedule_interleaves_gsm_and_cycles_lengths():
    spec = {"longctx_gsm_every": 3}
    plan = training._longctx_schedule(spec, {"steps": 7, "lengths": [128, 512]})
    assert plan == [("probe", 128), ("probe", 512), ("gsm", 0), ("probe", 128), ("probe", 512), ("gsm", 0), ("probe", 128)]
    assert all(k == "probe" for k, _ in training._longctx_schedule({"longctx_gsm_every": 0}, {"steps": 4, "lengths": [64]}))


def test_answer_windows_train_only_the_answer_and_the_newline(tiny_builds):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_builds[0].path / "tokenizer.json"))
    pairs = [("A pass key is hidden. The pass key is 42. What is the pass key? The pass key is", "42"),
             ("Short. The pass key is", "17")]
    ids, labels = training._answer_windows(tok, pairs)
    assert ids.shape[0] == 2 and labels.shape == ids.shape
    for row, (_, answer) in enumerate(pairs):
        trained = [int(t) for t in labels[row] if t != -100]
        assert tok.decode(trained) == " " + answer + "\n"
        # position p is labelled with token p + 1
        first = next(i for i, t in enumerate(labels[row]) if t != -100)
        assert int(ids[row, first + 1]) == trained[0]
    assert int(ids[1, -1]) == tok.token_to_id(builtin.PAD)  # the shorter row is padded


def test_existing_build_is_reused(tiny_builds):
    a = tiny_builds[0]
    mtime = (a.path / "model.safetensors").stat().st_mtime_ns
    again = training.build("tiny-gsm", spec_overrides=TINY, out_dir=a.path)
    assert again.fingerprint == a.fingerprint and again.info == a.info
    assert (a.path / "model.safetensors").stat().st_mtime_ns == mtime
    leftovers = [p.name for p in a.path.parent.iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    # readable by others as the umask allows (the temp build dir starts out 0700)
    umask = os.umask(0)
    os.umask(umask)
    assert a.path.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (a.path / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        training.build("tiny-gsm", spec_overrides=TINY, out_dir=tmp_path / "x")
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_names_and_errors():
    assert builtin.is_builtin("builtin:tiny-gsm")
    assert not builtin.is_builtin("meta-llama/Llama-3.2-1B")
    assert not builtin.is_builtin("/models/tiny-gsm")
    assert builtin.builtin_name("builtin:tiny-gsm") == "tiny-gsm"
    assert {"tiny-gsm", "tiny-moe"} <= set(builtin.BUILTIN_MODELS)
    with pytest.raises(UserError, match="tiny-gsm"):
        builtin.ensure_builtin("no-such-model")
    with pytest.raises(UserError, match="unknown spec key"):
        builtin.model_spec("tiny-gsm", {"hidden_sise": 3})


def test_default_path_is_spec_hashed_under_models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path))
    p = builtin.default_path("builtin:tiny-gsm")
    assert p.parent == tmp_path / "models"
    assert p.name.startswith("tiny-gsm-") and len(p.name) == len("tiny-gsm-") + 12
    assert builtin.default_path("tiny-gsm") == p
    assert builtin.default_path("tiny-gsm", {"seed": 99}) != p


def test_import_is_light():
    code = "import sys, evalpipe.models.builtin, evalpipe.models; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_build_entry_point_prints_one_json_line(tmp_path):
    env = {**os.environ, "EVALPIPE_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "evalpipe.lab.build", "builtin:tiny-gsm"]
    for k, v in TINY.items():
        args += ["--set", f"{k}={json.dumps(v)}"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    res = json.loads(lines[0])
    assert set(res) == {"path", "fingerprint"}
    assert res["path"].startswith(str(tmp_path / "cache" / "models" / "tiny-gsm-"))
    assert "step" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "evalpipe.lab.build", "nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "tiny-gsm" in bad.stderr and bad.stdout == ""


# ----------------------------------------------------------------------------- shipped files


def _tiny_recipe(monkeypatch, shipped_root):
    """Make the default recipe of tiny-gsm the few-second TINY one, shipped under ``shipped_root``."""
    full = builtin.BUILTIN_MODELS["tiny-gsm"]
    monkeypatch.setitem(builtin.BUILTIN_MODELS, "tiny-gsm", lambda: {**full(), **TINY})
    monkeypatch.setattr(builtin, "SHIPPED_DIR", shipped_root)


@pytest.mark.parametrize("name", sorted(builtin.BUILTIN_MODELS))
def test_shipped_model_matches_its_recorded_fingerprint_and_the_current_recipe(name):
    model = builtin.ensure_builtin(f"builtin:{name}")
    assert model.path == builtin.SHIPPED_DIR / name
    info = json.loads((model.path / builtin.INFO_FILE).read_text())
    assert builtin.fingerprint_dir(model.path) == info["fingerprint"] == model.fingerprint
    assert info["spec_hash"] == builtin.spec_hash(name, builtin.model_spec(name))
    # the fingerprint covers everything an engine reads, and every such file is recorded
    assert sorted(info["files"]) == list(builtin.FINGERPRINT_FILES)
    for fname, digest in info["files"].items():
        assert builtin.file_sha256(model.path / fname) == digest, fname
    assert info["built_on"]["cpu"] and info["torch_version"]


@pytest.mark.parametrize("name", sorted(builtin.BUILTIN_MODELS))
def test_readme_records_the_shipped_fingerprint(name):

    fingerprint = builtin.ensure_builtin(name).fingerprint
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert fingerprint in readme, "record the shipped model's fingerprint in the README"


def test_tiny_gsm_is_the_one_runs_are_checked_with(builtin_model_dir):
    assert builtin_model_dir == builtin.SHIPPED_DIR / "tiny-gsm"


def _moe_layers(cfg: dict) -> list[int]:
    return list(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]))


def test_shipped_tiny_moe_has_what_vllms_deepseek_layer_needs():
    """vLLM's CPU DeepSeek layer (MLA + MoE) at tensor parallel 2 and expert parallel 4:
    the MLA decode kernel takes a 576-wide latent head only, the aux-free gate needs its
    correction bias in the weights, and heads and experts must split evenly."""
    from safetensors import safe_open

    path = builtin.ensure_builtin("tiny-moe").path
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert cfg["kv_lora_rank"] == 512 and cfg["qk_rope_head_dim"] == 64
    assert cfg["topk_method"] == "noaux_tc" and cfg["scoring_func"] == "sigmoid"
    assert cfg["n_group"] == 1 and cfg["topk_group"] == 1 and cfg["norm_topk_prob"] is True
    assert cfg["n_routed_experts"] % 4 == 0 and cfg["num_attention_heads"] % 2 == 0
    assert cfg["first_k_dense_replace"] >= 1 and _moe_layers(cfg)
    assert cfg["max_position_embeddings"] >= 4096
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]  # read by transformers 4 and 5
    assert cfg["tie_word_embeddings"] is False  # vLLM's DeepSeek model loads lm_head itself
    with safe_open(str(path / "model.safetensors"), "np") as fh:
        keys = set(fh.keys())
    assert "lm_head.weight" in keys
    for layer in _moe_layers(cfg):
        assert f"model.layers.{layer}.mlp.gate.e_score_correction_bias" in keys, layer
        for expert in range(cfg["n_routed_experts"]):  # one tensor per expert, as vLLM's loader maps them
            assert f"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" in keys, (layer, expert)
    # same tokenizer recipe as tiny-gsm: prompts tokenize alike
    gsm = builtin.ensure_builtin("tiny-gsm").path
    assert (path / "tokenizer.json").read_bytes() == (gsm / "tokenizer.json").read_bytes()


# tiny-moe's code path in a few seconds: the latent and rope widths stay as vLLM needs them
TINY_MOE = {**{k: v for k, v in TINY.items() if k != "head_dim"}, "hidden_size": 64, "num_key_value_heads": 2,
            "moe_intermediate_size": 32, "num_hidden_layers": 2, "steps": 3, "longctx_stages": []}


def test_a_deepseek_v3_build_saves_the_gate_bias_and_the_vllm_config_keys(tmp_path):
    from safetensors import safe_open

    model = training.build("tiny-moe", spec_overrides=TINY_MOE, out_dir=tmp_path / "moe")
    cfg = json.loads((model.path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["kv_lora_rank"]) == ("noaux_tc", "sigmoid", 512)
    assert cfg.get("num_nextn_predict_layers", 0) == 0  # no multi-token-prediction layer to load
    with safe_open(str(model.path / "model.safetensors"), "np") as fh:
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in set(fh.keys())
    assert model.info.n_params > 0 and model.info.spec["arch"] == "deepseek_v3"


def test_an_unknown_architecture_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(UserError, match="unknown arch 'gpt2'.*deepseek_v3, llama"):
        training.build("tiny-gsm", spec_overrides={**TINY, "arch": "gpt2"}, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_ship_then_serve_round_trip(tmp_path, monkeypatch):
    _tiny_recipe(monkeypatch, tmp_path / "shipped")
    shipped = training.ship("tiny-gsm")
    assert shipped.path == tmp_path / "shipped" / "tiny-gsm"
    assert [p.name for p in (tmp_path / "shipped").iterdir()] == ["tiny-gsm"]  # no staging left
    served = builtin.ensure_builtin("tiny-gsm")
    assert served.fingerprint == shipped.fingerprint == builtin.fingerprint_dir(served.path)
    # shipping again replaces the files whole (same recipe, same machine: same bytes)
    again = training.ship("tiny-gsm")
    assert again.fingerprint == shipped.fingerprint
    assert sorted(p.name for p in (tmp_path / "shipped").iterdir()) == ["tiny-gsm"]


def test_altered_missing_or_outdated_shipped_files_are_refused(tmp_path, monkeypatch):
    _tiny_recipe(monkeypatch, tmp_path / "shipped")
    path = training.ship("tiny-gsm").path
    weights = path / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(builtin.ShippedModelError, match=r"model\.safetensors does not match its recorded sha256"):
        builtin.ensure_builtin("tiny-gsm")
    weights.write_bytes(original[:100])  # truncated
    with pytest.raises(builtin.ShippedModelError, match="altered or truncated"):
        builtin.ensure_builtin("tiny-gsm")
    weights.write_bytes(original)
    builtin.ensure_builtin("tiny-gsm")
    # a recipe change without regenerating the shipped files
    full = builtin.BUILTIN_MODELS["tiny-gsm"]
    monkeypatch.setitem(builtin.BUILTIN_MODELS, "tiny-gsm", lambda: {**full(), "lr": 1e-3})
    with pytest.raises(builtin.ShippedModelError, match=r"another recipe .*--ship"):
        builtin.ensure_builtin("tiny-gsm")
    monkeypatch.setattr(builtin, "SHIPPED_DIR", tmp_path / "nowhere")
    with pytest.raises(builtin.ShippedModelError, match="are missing"):
        builtin.ensure_builtin("tiny-gsm")


def test_ship_flag_takes_no_overrides(tmp_path):
    out = subprocess.run([sys.executable, "-m", "evalpipe.lab.build", "tiny-gsm", "--ship", "--set", "steps=3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--ship" in out.stderr and out.stdout == ""


def test_machine_description_names_the_cpu_and_its_vector_extensions():
    from evalpipe.machine import describe, one_line

    cpuinfo = ("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n\n"
               "processor\t: 1\nmodel name\t: Example CPU 9000\nflags\t\t: fpu\n")
    hw = describe(cpuinfo)
    assert hw["cpu"] == "Example CPU 9000" and hw["isa"] == ["avx2", "avx512f"]
    assert one_line(hw).startswith("Example CPU 9000 (avx2, avx512f), ")
    assert one_line({"cpus": 2, "machine": "x86_64", "system": "Linux"}) == "2 CPUs, x86_64 Linux"


def test_the_model_info_file_is_typed_and_a_foreign_one_refused_in_one_sentence(tmp_path):
    """evalpipe-model.json is read as its model: the shipped file (written before it had a
    version) reads as version 1; a file with a key this evalpipe does not know is refused."""
    shipped = builtin.load_built(builtin.shipped_path("tiny-gsm"))
    assert shipped is not None and shipped.info.version == 1 and shipped.info.built_on.cpu
    raw = json.loads((builtin.shipped_path("tiny-gsm") / builtin.INFO_FILE).read_text())
    (tmp_path / builtin.INFO_FILE).write_text(json.dumps({**raw, "colour": "blue"}))
    with pytest.raises(builtin.ShippedModelError) as err:
        builtin.load_built(tmp_path)
    message = str(err.value)
    assert "colour" in message and builtin.INFO_FILE in message and "\n" not in message
