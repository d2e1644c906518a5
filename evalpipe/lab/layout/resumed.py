"""Which rows of the next forward pass recompute a request the scheduler had preempted.

A preempted request loses its KV blocks and is computed again from its prompt and the
tokens it had generated: to the model that recompute is an ordinary prefill, its positions
say nothing. Only the scheduler knows; it tells the model runner which requests it resumes
(``scheduled_cached_reqs.resumed_req_ids``) in the step it schedules them again. The
``recompute_error`` fault reads that here: the model runner's state update is wrapped (in
the engine process, where the model runs beside its runner) to note the resumed requests'
rows of the step it prepares, in the persistent batch's order, which is the order of the
pass's rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_lock = threading.Lock()
_installed = False
# (row count of the step, its resumed requests' row ranges); replaced at every step
_step: tuple[int, tuple[tuple[int, int], ...]] = (0, ())


def resumed_ranges(req_ids: list[str], scheduled: dict[str, int], resumed: set[str]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The step's row count and the (start, stop) rows of its resumed requests, from the
    batch's request order and each request's scheduled token count."""
    ranges: list[tuple[int, int]] = []
    row = 0
    for req_id in req_ids:
        count = scheduled[req_id]
        if req_id in resumed:
            ranges.append((row, row + count))
        row += count
    return row, tuple(ranges)


def note_step(total_rows: int, ranges: tuple[tuple[int, int], ...]) -> None:
    global _step
    _step = (total_rows, ranges)


def resumed_rows(rows: int, device: torch.device) -> torch.Tensor | None:
    """The current pass's rows that recompute a preempted request (a boolean mask), None
    for none. A pass whose row count is not the step's noted count (a profiling or warm-up
    run, padding) is left alone rather than guessed at."""
    total, ranges = _step
    if not ranges or total != rows:
        return None
    mask = torch.zeros(rows, dtype=torch.bool, device=device)
    for start, stop in ranges:
        mask[start:stop] = True
    return mask


def _wrap(update: Callable[..., Any]) -> Callable[..., Any]:
    def update_and_note(runner: Any, scheduler_output: Any) -> Any:
        result = update(runner, scheduler_output)
        note_step(*resumed_ranges(
            list(runner.input_batch.req_ids), scheduler_output.num_scheduled_tokens,
            set(scheduler_output.scheduled_cached_reqs.resumed_req_ids),
        ))
        return result

    return update_and_note


def watch_resumed_requests() -> None:
    """Wrap vLLM's model runner once per process (the CPU runner inherits the method)."""
    global _installed
    with _lock:
        if _installed:
            return
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: PLC0415 - only a faulty engine wraps it

        GPUModelRunner._update_states = _wrap(GPUModelRunner._update_states)  # type: ignore[method-assign]
        _installed = True
