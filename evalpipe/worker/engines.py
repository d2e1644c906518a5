"""The engine behind a variant, behind one small interface.

Everything above this module speaks `GenRequest` / `GenResult` / `ScoreRequest`;
only the engine classes know whether tokens come from an in-process `vllm.LLM`
(here, the only place that imports vllm) or from a vLLM server over HTTP
(http_engine.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

ProgressFn = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class GenRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    label: str | None = None  # names the request in errors, e.g. "gsm8k doc 17"


@dataclass
class GenResult:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # logprob of each generated token
    topk_ids: list[list[int]]  # per position, the k most likely ids, best first
    topk_logprobs: list[list[float]]
    finish_reason: str


@dataclass(frozen=True)
class ScoreRequest:
    """Score `token_ids[start:]` given everything before it (prefill only, no decode);
    with `positions`, exactly those (absolute, >= 1) positions instead."""

    token_ids: list[int]
    start: int
    positions: list[int] | None = None
    label: str | None = None

    def scored(self) -> Sequence[int]:
        return self.positions if self.positions is not None else range(max(self.start, 1), len(self.token_ids))


@dataclass
class ScoreResult:
    logprobs: list[float]  # one per scored position
    is_greedy: list[bool]  # the scored token was the argmax at that position
    # per scored position, the k most likely ids / logprobs (best first)
    topk_ids: list[list[int]] = field(default_factory=list)
    topk_logprobs: list[list[float]] = field(default_factory=list)


class Engine(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def generate(self, requests: list[GenRequest], topk: int, progress: ProgressFn | None = None) -> list[GenResult]: ...

    def score(
        self, requests: list[ScoreRequest], progress: ProgressFn | None = None, topk: int = 1
    ) -> list[ScoreResult]: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _progress_bar_factory(progress: ProgressFn | None):
    """vLLM takes a tqdm factory for its progress bar; ours forwards counts as events."""
    from tqdm import tqdm

    class _Forwarding(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = open("/dev/null", "w")  # noqa: SIM115 - closed with the bar
            kwargs["mininterval"] = 0.5
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            out = super().update(n)
            if progress is not None:
                progress(int(self.n), int(self.total or 0))
            return out

        def close(self) -> None:
            fh = self.fp
            super().close()
            try:
                fh.close()
            except Exception:
                pass

    return _Forwarding if progress is not None else False


def ranked_topk(entries: Iterable[tuple[int, int | None, float]], k: int) -> tuple[list[int], list[float]]:
    """The k best of one position's (id, rank, logprob) entries, by vLLM's rank (ties:
    by id); entries without a rank or ranked below k are not part of the top k."""
    ranked = sorted(((tid, rank, lp) for tid, rank, lp in entries if rank is not None and rank <= k),
                    key=lambda e: (e[1], e[0]))[:k]
    return [tid for tid, _, _ in ranked], [float(lp) for _, _, lp in ranked]


def _topk_of(position: dict[int, Any] | None, k: int) -> tuple[list[int], list[float]]:
    """The k best (id, logprob) of one position of vLLM's Logprob objects."""
    return ranked_topk(((tid, lp.rank, lp.logprob) for tid, lp in (position or {}).items()), k)


class OfflineEngine:
    """`vllm.LLM` in this process (its engine core runs in a process of its own unless
    VLLM_ENABLE_V1_MULTIPROCESSING=0, as the CPU configs set)."""

    def __init__(self, engine_args: dict[str, Any]):
        from vllm import LLM

        self._args = dict(engine_args)
        self._llm = LLM(**self._args)
        self._tokenizer = self._llm.get_tokenizer()
        self._max_model_len = int(self._llm.llm_engine.model_config.max_model_len)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(s) for s in sequences]

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def eos_token_id(self) -> int | None:
        return self._tokenizer.eos_token_id

    def generate(self, requests: list[GenRequest], topk: int, progress: ProgressFn | None = None) -> list[GenResult]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=r.max_tokens,
                stop=list(r.stop) or None,
                logprobs=topk,
                seed=0,
            )
            for r in requests
        ]
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        outputs = self._llm.generate(prompts, params, use_tqdm=_progress_bar_factory(progress))
        results = []
        for out in outputs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            logprobs, top_ids, top_lps = [], [], []
            for pos, tid in enumerate(ids):
                position = comp.logprobs[pos] if comp.logprobs is not None else None
                chosen = position.get(tid) if position else None
                logprobs.append(float(chosen.logprob) if chosen is not None else math.nan)
                t_ids, t_lps = _topk_of(position, topk)
                top_ids.append(t_ids)
                top_lps.append(t_lps)
            results.append(
                GenResult(
                    text=comp.text,
                    token_ids=ids,
                    logprobs=logprobs,
                    topk_ids=top_ids,
                    topk_logprobs=top_lps,
                    finish_reason=str(comp.finish_reason),
                )
            )
        return results

    def score(
        self, requests: list[ScoreRequest], progress: ProgressFn | None = None, topk: int = 1
    ) -> list[ScoreResult]:
        from vllm import SamplingParams

        # max_tokens=1 is the least decode vLLM allows; prompt_logprobs=1 gives each
        # position's argmax beside the actual token, enough for lm-eval's is_greedy.
        # Teacher forcing asks for the variant's own top-k at every forced position.
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=max(1, topk))
        results = []
        # vLLM returns every prompt position's top-k as Python objects; sending the work
        # in slices of a bounded token count keeps that transient memory bounded too,
        # and only the asked-for positions are kept from each slice.
        for lo, hi in token_budget_slices([len(r.token_ids) for r in requests], SCORE_TOKENS_PER_CALL):
            prompts = [{"prompt_token_ids": r.token_ids} for r in requests[lo:hi]]
            bar = _progress_bar_factory(_offset_progress(progress, lo, len(requests)))
            outputs = self._llm.generate(prompts, params, use_tqdm=bar)
            results += [self._scored(req, out, topk) for req, out in zip(requests[lo:hi], outputs)]
            del outputs
        return results

    @staticmethod
    def _scored(req: ScoreRequest, out: Any, topk: int) -> ScoreResult:
        result = ScoreResult(logprobs=[], is_greedy=[])
        for pos in req.scored():
            position = out.prompt_logprobs[pos]
            chosen = position[req.token_ids[pos]]
            result.logprobs.append(float(chosen.logprob))
            result.is_greedy.append(chosen.rank == 1)
            t_ids, t_lps = _topk_of(position, topk)
            result.topk_ids.append(t_ids)
            result.topk_logprobs.append(t_lps)
        return result

    def info(self) -> dict[str, Any]:
        return {"kind": "offline", "max_model_len": self._max_model_len}

    def close(self) -> None:
        """Stop vLLM's engine-core process now, not during interpreter teardown."""
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


# Tokens per engine call when scoring (see OfflineEngine.score).
SCORE_TOKENS_PER_CALL = 1 << 18


def token_budget_slices(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) slices whose token counts stay within ``budget`` (a single
    longer request gets a slice of its own); covers every index once, in order."""
    slices, lo, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > lo and used + n > budget:
            slices.append((lo, i))
            lo, used = i, 0
        used += n
    if lo < len(lengths):
        slices.append((lo, len(lengths)))
    return slices


def _offset_progress(progress: ProgressFn | None, offset: int, total: int) -> ProgressFn | None:
    if progress is None:
        return None
    return lambda done, _slice_total: progress(offset + done, total)


def in_order(call: Callable[[list], list], requests: list, reverse: bool) -> list:
    """``call(requests)``, sending the requests in reverse order when asked (the A/A
    run: the engine forms other batches from the same work); results in input order."""
    return call(requests[::-1])[::-1] if reverse else call(requests)


def decode_each(engine: Engine, token_ids: Sequence[int]) -> list[str]:
    """Each token's own text (for reports' context), decoding every distinct id once."""
    distinct = sorted(set(token_ids))
    texts = dict(zip(distinct, engine.decode_many([[tid] for tid in distinct])))
    return [texts[tid] for tid in token_ids]


def build_engine(kind: str, engine_args: dict[str, Any], server: dict[str, Any] | None = None,
                 on_wait: Callable[[float], None] | None = None, journal: Path | None = None) -> Engine:
    """``offline``: vllm.LLM(**engine_args) here; ``http``: the server ``server`` describes
    (url, model, client settings; see http_engine.ServerSettings), waiting until it is ready,
    answering from ``journal`` (worker/journal.py) what an earlier attempt already asked.
    The offline engine keeps no journal: vLLM's LLM.generate returns all answers at once."""
    if kind == "offline":
        return OfflineEngine(engine_args)
    if kind == "http":
        from evalpipe.worker.http_engine import HttpEngine, ServerSettings
        from evalpipe.worker.journal import RequestJournal

        # lazy: lm-eval builds its requests while the server is still starting
        return HttpEngine(ServerSettings.from_job(server or {}), on_wait=on_wait, lazy=True,
                          journal=RequestJournal(journal) if journal is not None else None)
    raise ValueError(f"unknown engine kind {kind!r}; known: offline, http")
