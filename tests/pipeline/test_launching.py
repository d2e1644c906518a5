"""evalpipe/pipeline/launching.py, one variant from start to its closed directory on the
fake engine (the whole run is tests/pipeline/test_runs_on_the_fake_engine.py): the worker run,
its manifest closed with how it ended and its probe records gathered; a server command that
is not there fails the variant in one sentence saying what to fix; the CLI's stall limit
wins over the variant's; and a server no later variant runs against is stopped."""

from __future__ import annotations

import json
from types import SimpleNamespace

from plans import fake_plan

from evalpipe.documents.run_doc import RunModel
from evalpipe.pipeline.launching import Limits, run_and_close, stop_unneeded
from evalpipe.probing.names import VariantNames
from evalpipe.rundir import artifacts

MODEL = RunModel(path="/models/tiny-gsm", builtin=False)


def test_a_variant_runs_and_closes_its_directory(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}}, "one")
    (variant,) = plan.variants
    vdir = plan.run_dir / "a"
    events: list = []
    outcome = run_and_close(plan, variant, MODEL, vdir, events.append, Limits(timeout_s=300), {}, VariantNames())
    assert outcome.ok, outcome
    manifest = json.loads((vdir / artifacts.MANIFEST_JSON).read_text())
    assert manifest["status"] == "ok" and manifest["engine"]["kind"] == "fake"
    probes = json.loads((vdir / "probes.json").read_text())
    assert probes["variant"] == "a" and probes["mode"] == "offline" and probes["processes"], "the worker's own record"
    assert events, "the worker's events reached the caller"


def test_a_server_command_that_is_not_there_fails_the_variant_saying_what_to_fix(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}}, "served", launch={"mode": "serve", "command": ["/nonexistent/serve"]})
    (variant,) = plan.variants
    servers: dict = {}
    outcome = run_and_close(plan, variant, MODEL, plan.run_dir / "a", lambda e: None, Limits(timeout_s=60), servers, VariantNames())
    assert outcome.exit_code == 3 and servers == {}
    assert "could not start its server `/nonexistent/serve" in (outcome.error or "") and "fix launch.command" in (outcome.error or "")


def test_the_command_line_s_stall_limit_wins_over_the_variant_s():
    variant = SimpleNamespace(launch=SimpleNamespace(stall_timeout_s=600.0))
    assert Limits().stall_of(variant) == 600.0 and Limits(stall_timeout_s=5.0).stall_of(variant) == 5.0


def test_only_the_servers_a_later_variant_runs_against_stay_up():
    stopped: list[str] = []
    servers = {name: SimpleNamespace(stop=lambda name=name: stopped.append(name)) for name in ("a", "b")}
    stop_unneeded(servers, [SimpleNamespace(server_of="a"), SimpleNamespace(server_of=None)])
    assert stopped == ["b"] and list(servers) == ["a"]
    stop_unneeded(servers, [])
    assert stopped == ["b", "a"] and servers == {}
