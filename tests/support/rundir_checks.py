"""A finished run directory to check (integrity, the lock), and the one error line a
refused command prints."""

from __future__ import annotations

from pathlib import Path

from fakes import make_samples, mutate, record_artifacts, set_token, write_run

from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.rundir import artifacts, integrity
from evalpipe.rundir.artifacts import RunDir


def finished_run(root: Path, *, record: bool = True) -> Path:
    """legacy vs sp (one changed token), both with teacher.parquet; with ``record`` each
    manifest gets the artifacts record the worker's finish step writes."""
    s = make_samples(8)
    run_dir = write_run(root, {"legacy": s, "sp": mutate(s, 2, set_token(3, 7))}, reference="legacy",
                        run_info={"status": "ok"}, teachers={"legacy": s, "sp": s})
    for name in ("legacy", "sp"):
        vdir = RunDir(run_dir).variant(name)
        artifacts.write_json(vdir.results, {"results": {"t": {"acc": 0.5}}})
        if record:
            record_artifacts(vdir)
    return run_dir


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output, output
    assert len(lines) >= 1 and lines[0].startswith("error: "), output
    return " ".join(" ".join(lines)[len("error: "):].split())  # rich wraps long lines


def sampled_sequences(run_dir: Path, variant: str) -> dict[tuple[int, int], list[int]]:
    """A variant's generated token ids per (item, sample), from its tokens.parquet."""
    import pyarrow.parquet as pq

    rows = pq.read_table(run_dir / variant / artifacts.TOKENS_PARQUET).select(["doc_id", "repeat", "token_id"]).to_pylist()
    out: dict[tuple[int, int], list[int]] = {}
    for r in rows:  # in position order within each sample
        out.setdefault((r["doc_id"], r["repeat"]), []).append(r["token_id"])
    return out


def finished_reference(vdir: artifacts.VariantDir, samples, tokens) -> None:
    """A reference variant as its worker finishes it: its two tables, then a manifest
    recording them."""
    artifacts.write_table(vdir.samples, samples)
    artifacts.write_table(vdir.tokens, tokens)
    write_manifest(vdir.manifest, VariantManifest.model_validate(
        {"variant": vdir.root.name, "status": "ok", integrity.ARTIFACTS_KEY: integrity.describe_artifacts(vdir)}))
