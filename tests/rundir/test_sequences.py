"""The reference's sequences (evalpipe/rundir/sequences.py): each generated sample's prompt ids
joined with its continuation in position order, samples in (task, doc, repeat) order, a
sample without prompt ids or without generated tokens left out; read from a variant
directory only when its files match its manifest; and where T contiguous shards start."""

from __future__ import annotations

import pytest
from rundir_checks import finished_reference

from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.errors import UserError
from evalpipe.rundir import artifacts, integrity
from evalpipe.rundir.sequences import ReferenceSequence, read_reference_sequences, reference_sequences, shard_boundaries


def _sample(task: str, doc: int, repeat: int, prompt: list[int] | None) -> dict:
    return {"task": task, "doc_id": doc, "repeat": repeat, "prompt_hash": f"{task}{doc}", "prompt": "p", "target": "t",
            "response": "r", "n_tokens": 1, "finish_reason": "stop", artifacts.PROMPT_IDS_COLUMN: prompt}


def _tables():
    samples = artifacts.samples_table([
        _sample("b", 0, 0, [1]), _sample("a", 2, 1, [2, 3]), _sample("a", 2, 0, [4]),
        _sample("a", 5, 0, [6]),  # prompt ids but nothing generated
        _sample("a", 7, 0, None),  # generated but no prompt ids
    ])
    keys = [("a", 2, 1, 1, 31), ("b", 0, 0, 0, 10), ("a", 2, 1, 0, 30), ("a", 2, 0, 0, 20), ("a", 7, 0, 0, 70)]
    tokens = artifacts.tokens_table({
        "task": [k[0] for k in keys], "doc_id": [k[1] for k in keys], "repeat": [k[2] for k in keys],
        "pos": [k[3] for k in keys], "token_id": [k[4] for k in keys], "logprob": [-0.5] * 5,
        "topk_ids": [[1]] * 5, "topk_logprobs": [[-0.5]] * 5})
    return samples, tokens


def test_the_sequences_are_in_key_order_with_their_continuations_in_position_order():
    assert reference_sequences(*_tables()) == [
        ReferenceSequence("a", 2, 0, prompt_token_ids=[4], continuation_ids=[20]),
        ReferenceSequence("a", 2, 1, prompt_token_ids=[2, 3], continuation_ids=[30, 31]),
        ReferenceSequence("b", 0, 0, prompt_token_ids=[1], continuation_ids=[10]),
    ]


def test_a_variant_directory_is_read_only_when_it_matches_its_manifest(tmp_path):
    samples, tokens = _tables()
    vdir = artifacts.VariantDir(tmp_path / "legacy")
    artifacts.write_table(vdir.samples, samples)
    with pytest.raises(UserError, match=r"needs the reference's tokens.parquet, but .* does not exist"):
        read_reference_sequences(vdir.root)
    artifacts.write_table(vdir.tokens, tokens)
    write_manifest(vdir.manifest, VariantManifest.model_validate(
        {"variant": "legacy", "status": "ok", integrity.ARTIFACTS_KEY: integrity.describe_artifacts(vdir)}))
    assert read_reference_sequences(vdir.root) == reference_sequences(samples, tokens)
    artifacts.write_table(vdir.samples, samples.slice(0, 2))
    with pytest.raises(integrity.ArtifactMismatch, match="samples.parquet"):
        read_reference_sequences(vdir.root)


def test_the_reference_is_read_while_its_parent_adds_probes_json_to_the_record(tmp_path):
    # On a cluster the reference's parent writes probes.json, then adds it to the manifest;
    # a variant teacher-forcing beside it may read in between.
    samples, tokens = _tables()
    vdir = artifacts.VariantDir(tmp_path / "legacy")
    finished_reference(vdir, samples, tokens)
    artifacts.write_text(vdir.root / artifacts.PROBES_JSON, "{}\n")
    assert read_reference_sequences(vdir.root) == reference_sequences(samples, tokens)
    with pytest.raises(integrity.ArtifactMismatch, match="probes.json is not in its manifest"):
        integrity.verify_variant(vdir)  # a reader of the finished run still sees the addition


@pytest.mark.parametrize("n, tp, starts", [
    (12, 3, [4, 8]),  # even shards
    (7, 2, [4]),  # padded to 8: the last shard is shorter
    (3, 4, [1, 2]),  # fewer tokens than ranks: a shard of padding only starts nowhere
    (9, 1, []),  # one rank: no boundary
])
def test_shard_boundaries(n, tp, starts):
    assert shard_boundaries(n, tp) == starts
