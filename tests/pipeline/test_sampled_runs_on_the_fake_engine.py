"""Sampled runs (`sampling:`, common random numbers) end to end on the fake engine, whose
seeded sampler keys its Gumbel noise on (seed, step, token id) as vLLM's V2 sampler does:
the orchestration, the per-sample rows, compare.json's sampling figures, the sampled gates
and the A/A reproducibility check, without vLLM (the real engine: tests/e2e/test_sampling.py).

  ref        the reference (and its A/A run, requests reversed)
  same       the same fake model                     -> IDENTICAL, no sample leaves the path
  diverge    another distribution from the 4th token -> DIVERGENT; its divergences are what the
                                                        distributions explain
  unseeded   a sampler that ignores the seed         -> more divergences than the distributions
                                                        explain: sampled_excess_divergence fails
A second run whose reference is the unseeded sampler: its A/A run does not repeat its own
samples, and every comparison is INCONCLUSIVE, naming the sampling settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evalpipe.config.sampling import sample_seed
from evalpipe.rundir import artifacts
from tests.pipeline.test_runs_on_the_fake_engine import FAKE_ENGINE_ENV, comparison, evalpipe, write_config

LIMIT = 5
SAMPLES = 3
TASK = "gsm8k_synth_4shot"
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "samples": SAMPLES, "seed": 42}


def sampled_config(tmp: Path, name: str, variants: dict, reference: str = "ref") -> Path:
    path = write_config(tmp, name, variants, reference)
    cfg = yaml.safe_load(path.read_text())
    cfg.update(sampling=SAMPLING, noise_floor=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def gate(c: dict, name: str) -> dict:
    (g,) = [g for g in c["gates"] if g["gate"] == name]
    return g


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sampled")
    path = sampled_config(tmp, "sampled", {
        "ref": {},
        "same": {"expect": {"same_path": True}},
        "diverge": {"env": {FAKE_ENGINE_ENV: "diverge=4"}},
        "unseeded": {"env": {FAKE_ENGINE_ENV: "unseeded"}},
    })
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "fake-sampled", cwd=tmp)
    return {"proc": proc, "dir": tmp / "runs" / "fake-sampled", "tmp": tmp}


def test_every_sample_is_a_row_with_its_seed_and_the_a_a_run_repeats_them(run):
    assert run["proc"].returncode == 1, run["proc"].stdout[-3000:]  # DIVERGENT: diverge and unseeded
    rows = artifacts.read_table(run["dir"] / "ref" / "samples.parquet").to_pylist()
    assert len(rows) == LIMIT * SAMPLES
    assert all(r["seed"] == sample_seed(42, TASK, r["doc_id"], 0, r["repeat"]) for r in rows)
    doc = json.loads((run["dir"] / "compare.json").read_text())
    (aa,) = doc["noise_floor"]["sampling"]
    assert doc["noise_floor"]["status"] == "IDENTICAL" and aa["divergent"] == 0 and aa["samples"] == LIMIT * SAMPLES


def test_the_same_model_keeps_every_sample_on_the_path(run):
    c = comparison(run["dir"], "same")
    (t,) = c["sampling"]
    assert c["status"] == "IDENTICAL"
    assert (t["samples"], t["items"], t["samples_per_item"], t["divergent"], t["predicted"]) == (LIMIT * SAMPLES, LIMIT, SAMPLES, 0, 0.0)
    assert (t["temperature"], t["top_p"], t["top_k"], t["min_p"]) == (0.7, 0.9, 0, 0.0)
    assert {p["k"] for p in t["pass_at"]} == {1, 2, 3} and all(p["delta"] == 0 for p in t["pass_at"])
    assert gate(c, "sampled_excess_divergence")["status"] == "pass" and gate(c, "sampled_divergence_above_aa")["status"] == "pass"


def test_a_changed_distribution_diverges_as_much_as_it_explains(run):
    c = comparison(run["dir"], "diverge")
    (t,) = c["sampling"]
    assert c["status"] == "DIVERGENT" and t["divergent"] > 0 and t["first_divergence_min"] >= 4
    assert t["predicted"] >= t["divergent"] * 0.5 and t["tv_max"] > 0
    assert gate(c, "sampled_excess_divergence")["status"] == "pass"  # the distributions explain it
    assert gate(c, "sampled_divergence_above_aa")["status"] == "fail"  # the A/A run had none


def test_a_sampler_that_ignores_the_seed_diverges_beyond_what_the_distributions_explain(run):
    c = comparison(run["dir"], "unseeded")
    (t,) = c["sampling"]
    assert t["tv_max"] == 0.0 and t["predicted"] == 0.0 and t["divergent"] > 0, t
    excess = gate(c, "sampled_excess_divergence")
    assert excess["status"] == "fail" and "more divergences than the distributions explain" in excess["detail"]
    assert c["status"] == "DIVERGENT"


def test_a_reference_whose_a_a_run_draws_other_samples_makes_every_comparison_inconclusive(tmp_path):
    path = sampled_config(tmp_path, "unrepeatable", {
        "ref": {"env": {FAKE_ENGINE_ENV: "unseeded"}},
        "same": {"env": {FAKE_ENGINE_ENV: "unseeded"}, "expect": {"same_path": True}},
    })
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", "3", "--run-id", "u", cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout[-3000:]
    c = comparison(tmp_path / "runs" / "u", "same")
    assert c["status"] == "INCONCLUSIVE"
    assert c["reasons"][0].startswith("the engine is not reproducible under these sampling settings (temperature 0.7, top_p 0.9")
    assert "seeds not honoured, or a sampler that draws per batch" in c["reasons"][0]
