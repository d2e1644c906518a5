"""Which rows of a forward pass each path-specific fault acts on."""

import torch

from evalpipe.lab.layout.faults import FAR_POSITION, FAULTS, PATH_FAULTS
from evalpipe.lab.layout.path_faults import path_fault_rows

# a pass holding: a fresh prefill (0-3), a prefill continuing from a cached part (896-898),
# a decode step (57), and a prefill near the window (FAR_POSITION - 1 ..)
POSITIONS = torch.tensor([0, 1, 2, 3, 896, 897, 898, 57, FAR_POSITION - 1, FAR_POSITION, FAR_POSITION + 1])


def rows(fault: str, positions: torch.Tensor = POSITIONS, chunk: int = 512) -> list[int]:
    mask = path_fault_rows(frozenset({fault}), positions, chunk)
    return [] if mask is None else torch.nonzero(mask).flatten().tolist()


def test_a_continued_prefill_is_a_run_of_tokens_past_position_zero_a_chunk_at_a_multiple_of_the_budget():
    # 896 (7 cached blocks) and FAR_POSITION - 1 are not multiples of 512: cache hits
    assert rows("cached_prefix_error") == [4, 5, 6, 8, 9, 10]
    assert rows("chunk_continuation_error") == []
    chunks = torch.tensor([512, 513, 514, 1024, 1025])  # two requests' next chunks
    assert rows("chunk_continuation_error", chunks) == [0, 1, 2, 3, 4] and rows("cached_prefix_error", chunks) == []
    assert rows("chunk_continuation_error", chunks, chunk=8192) == [], "another budget: those are cache hits"
    for fault in ("cached_prefix_error", "chunk_continuation_error"):
        assert rows(fault, torch.tensor([0, 1, 2])) == []
        assert rows(fault, torch.tensor([1024])) == [], "a decode step is no prefill"


def test_far_positions_and_lone_decodes():
    assert rows("far_position_error") == [9, 10]
    assert rows("lone_decode_error", torch.tensor([57])) == [0]
    assert rows("lone_decode_error") == [], "a pass of many tokens is no lone decode"


def test_no_path_fault_or_another_fault_acts_nowhere():
    assert path_fault_rows(frozenset(), POSITIONS, 512) is None
    assert path_fault_rows(frozenset({"heads_permuted"}), POSITIONS, 512) is None


def test_the_path_faults_are_harmful_sp_faults_of_the_zoo():
    assert {f.name for f in PATH_FAULTS} == {"lone_decode_error", "cached_prefix_error", "chunk_continuation_error",
                                             "far_position_error", "recompute_error"}
    assert all(FAULTS[f.name] is f and f.harmful and f.layout == "sp" for f in PATH_FAULTS)


def test_the_recompute_fault_acts_on_the_rows_the_scheduler_resumed_and_nowhere_without_them():
    recomputed = torch.zeros(POSITIONS.shape[0], dtype=torch.bool)
    recomputed[1:3] = True
    mask = path_fault_rows(frozenset({"recompute_error"}), POSITIONS, 512, recomputed)
    assert mask is not None and torch.equal(mask, recomputed)
    assert path_fault_rows(frozenset({"recompute_error"}), POSITIONS, 512) is None
    assert path_fault_rows(frozenset({"lone_decode_error"}), POSITIONS, 512, recomputed) is None
