"""Hand-built nights for the history / nightly unit tests: run directories written
with the real artifact writers and compared with the real comparison (no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalpipe import artifacts
from evalpipe.artifacts import RunDir
from evalpipe.rundirs import compare_run, write_outputs

from tests.fakes import FakeSample, make_samples, mutate, set_token, write_run

DAY = 86400.0
T0 = 1_780_000_000.0
N_ITEMS = 200


def base_samples() -> list[FakeSample]:
    # about 60 % right, deterministic
    return make_samples(n=N_ITEMS, scores=[float((i * 7) % 10 < 6) for i in range(N_ITEMS)])


def faulty(samples: list[FakeSample], n_wrong: int = 12) -> list[FakeSample]:
    """The fault: ``n_wrong`` right answers go wrong and their first token changes."""
    out = samples
    right = [s.doc_id for s in samples if s.scores[next(iter(s.scores))] == 1.0][:n_wrong]
    for doc in right:
        out = mutate(out, doc, set_token(0, 7))
        out = [s.copy(scores={k: 0.0 for k in s.scores}) if s.doc_id == doc else s for s in out]
    return out


def write_night(root: Path, i: int, *, fault: bool = False, components: dict[str, str] | None = None,
                config_hash: str = "cfg1", extra: dict[str, Any] | None = None) -> Path:
    good = base_samples()
    sp = faulty(good) if fault else good
    run_dir = Path(root) / f"night-{i:02d}"
    write_run(
        run_dir, {"legacy": good, "legacy-aa": good, "sp": sp}, reference="legacy", noise_floor="legacy-aa",
        run_info={"status": "ok", "started_at": T0 + i * DAY, "kind": "nightly", "task_selector": "gsm8k",
                  "fingerprints": {"config_sha256": config_hash, "code": "v0.1.0-abc"},
                  "components": components or {"vllm_ascend": "good1"},
                  "variant_settings": {"legacy": {"env": {"EVALPIPE_LAYOUT": "legacy"}}, "legacy-aa": {"env": {"EVALPIPE_LAYOUT": "legacy"}},
                                       "sp": {"env": {"EVALPIPE_LAYOUT": "sp"}}},
                  "model": {"name": "builtin:tiny-gsm", "fingerprint": "f" * 64},
                  **(extra or {})},
    )
    for name in ("legacy", "legacy-aa", "sp"):
        vd = RunDir(run_dir).variant(name)
        manifest = artifacts.read_json(vd.manifest)
        manifest["versions"] = {"vllm": "0.32.0", "torch": "2.13.0+cpu", "vllm_ascend": None}
        artifacts.write_json(vd.manifest, manifest)
    comparison = compare_run(run_dir)
    info = artifacts.read_json(RunDir(run_dir).run_json)
    info["verdict"] = comparison.status.value
    artifacts.write_json(RunDir(run_dir).run_json, info)
    write_outputs(run_dir, comparison, info)
    return run_dir
