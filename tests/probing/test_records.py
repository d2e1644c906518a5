"""evalpipe/probing/records.py, the parent's side of the path probes: the spec a variant's
processes read at start (what to count, read and call; what could not be found, and why),
the environment that loads them, and the records read back (one that cannot be read is
named, not dropped silently) into probes.json, which reads back the same."""

from __future__ import annotations

import json

from evalpipe.probes import SITE_DIR, SPEC_ENV
from evalpipe.probing.names import ResolvedName, VariantNames
from evalpipe.probing.records import gather, probe_env, read_probes, read_records, records_dir, write_spec

NAMES = VariantNames({
    "pkg.f": ResolvedName("pkg.f", "function", "pkg.impl.f", "pkg.impl", "f"),
    "pkg.ready()": ResolvedName("pkg.ready()", "predicate", "pkg.ready()", "pkg", "ready"),
    "parallel_config.tensor_parallel_size": ResolvedName("parallel_config.tensor_parallel_size", "config",
                                                         "parallel_config.tensor_parallel_size"),
    "pkg.Model": ResolvedName("pkg.Model", "class", "pkg.Model", "pkg", "Model"),
    "pkg.gone": ResolvedName("pkg.gone", "function", error="does not exist: pkg has no attribute `gone`"),
})


def test_the_spec_says_what_to_count_read_and_call_and_what_is_absent(tmp_path):
    path = write_spec(tmp_path, "sp", NAMES)
    spec = json.loads(path.read_text())
    assert spec["variant"] == "sp" and spec["out_dir"] == str(records_dir(tmp_path))
    assert [f["canonical"] for f in spec["functions"]] == ["pkg.impl.f"]  # the class is compared, not counted
    assert [p["name"] for p in spec["predicates"]] == ["pkg.ready()"]
    assert spec["config_paths"] == ["parallel_config.tensor_parallel_size"]
    assert spec["absent"] == [{"name": "pkg.gone", "why": "does not exist: pkg has no attribute `gone`"}]
    assert "capture" not in spec


def test_the_environment_puts_the_probes_first_and_names_the_spec(tmp_path):
    env = probe_env({"PYTHONPATH": "/opt/plugin", "HOME": "/root"}, tmp_path / "spec.json")
    assert env["PYTHONPATH"].split(":") == [str(SITE_DIR), "/opt/plugin"]
    assert env[SPEC_ENV] == str(tmp_path / "spec.json") and env["HOME"] == "/root"
    assert probe_env({}, tmp_path / "s.json")["PYTHONPATH"] == str(SITE_DIR)


def test_records_that_cannot_be_read_are_named_and_probes_json_reads_back(tmp_path):
    spec = write_spec(tmp_path, "sp", NAMES)
    (spec.parent / "123.json").write_text("{not json")
    records, unreadable = read_records(spec.parent)
    assert records == [] and len(unreadable) == 1 and unreadable[0].startswith("123.json: ")
    doc = gather(tmp_path, "sp", "offline", NAMES)
    assert doc.unreadable == unreadable and doc.names["pkg.f"] == "pkg.impl.f" and doc.names["pkg.gone"] is None
    assert read_probes(tmp_path) == doc
    assert read_probes(tmp_path / "elsewhere") is None


def test_a_record_whose_histograms_count_more_passes_than_it_finished_is_named_not_read(tmp_path):
    """A histogram past `forwards` reads as a negative number of passes without the call:
    such a record contradicts itself and is named with why, not taken as evidence."""
    from evalpipe.probes.record import ModelRecord, ProcessRecord

    out = records_dir(tmp_path)
    rec = ProcessRecord(str(out), "sp")
    model = ModelRecord("pkg.Model", {"pkg.Layer": 2}, [])
    rec.models.append(model)
    snapshot = rec.forward_started(model, 4)
    rec.note("all_gather", "virtual", ())
    rec.forward_finished(model, snapshot)
    rec.write()
    (good,) = out.glob("*.json")
    records, unreadable = read_records(out)
    assert len(records) == 1 and unreadable == []
    doc = json.loads(good.read_text())
    doc["models"][0]["forwards"] = 0
    good.write_text(json.dumps(doc))
    records, unreadable = read_records(out)
    assert records == [] and len(unreadable) == 1
    assert unreadable[0].startswith(f"{good.name}: ") and "counts 1 forward passes of `all_gather`" in unreadable[0]
    assert "more than the 0 passes it finished" in unreadable[0]
