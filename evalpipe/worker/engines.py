"""The engine behind a variant, behind one small interface.

Everything above this module speaks `GenRequest` / `GenResult` / `ScoreRequest`;
only the engine classes know whether tokens come from an in-process `vllm.LLM`
(here, the only place that imports vllm) or from a vLLM server over HTTP
(http_engine.py); engine_choice.py picks the one a job asks for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from tqdm import tqdm

from evalpipe.documents.manifest import EngineInfo
from evalpipe.worker import engine_counters
from evalpipe.worker.journal import RequestJournal, request_key

ProgressFn = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class Draw:
    """How one generation is sampled: the sampler's settings (vLLM's names; top_k 0 is off)
    and the request's own seed, which makes its random numbers independent of its batch."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int

    def settings(self) -> dict[str, float | int]:
        return asdict(self)


# A request without a Draw decodes greedily; its seed (unused at temperature 0) is fixed so
# that the request, and its journal key, are the same in every run.
GREEDY: dict[str, float | int] = {"temperature": 0.0, "seed": 0}


@dataclass(frozen=True)
class GenRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    label: str | None = None  # names the request in errors, e.g. "gsm8k doc 17"
    draw: Draw | None = None  # None: greedy

    def sampler(self) -> dict[str, float | int]:
        return GREEDY if self.draw is None else self.draw.settings()


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

    def info(self) -> EngineInfo: ...

    def counters(self) -> dict[str, float] | None:
        """A reading of vLLM's own counters (evalpipe.worker.engine_counters); None: not exposed."""
        ...

    def close(self) -> None: ...


def _progress_bar_factory(progress: ProgressFn | None):
    """vLLM takes a tqdm factory for its progress bar; ours forwards counts as events."""
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


class InProcessEngine:
    """What the engines that compute in this process share (OfflineEngine, the fake engine
    of worker/fakes/): a tokenizer asked one text at a time, the context window they were
    built with, and the request journal (each call's results through ``JournaledCalls``;
    closed with the engine). A subclass sets ``_max_model_len`` and ``journal``."""

    _max_model_len: int
    journal: RequestJournal | None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, token_ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(s) for s in sequences]

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def counters(self) -> dict[str, float] | None:
        return None

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


class OfflineEngine(InProcessEngine):
    """`vllm.LLM` in this process (its engine core runs in a process of its own unless
    VLLM_ENABLE_V1_MULTIPROCESSING=0, as the CPU configs set).

    With a ``journal`` (worker/journal.py) every finished request's result is appended
    as it finishes, and a request the journal already answers is not sent again: an
    offline variant killed mid-task continues where it was, like a served one."""

    def __init__(self, engine_args: dict[str, Any], journal: RequestJournal | None = None):
        from vllm import LLM

        self._args = dict(engine_args)
        # vLLM counts the scheduler's paths (prefix-cache hits, preemptions, steps) only with
        # stat logging on, which LLM turns off by default; it changes no computation
        self._llm = LLM(**{"disable_log_stats": False, **self._args})
        self._tokenizer = self._llm.get_tokenizer()
        self._max_model_len = int(self._llm.llm_engine.model_config.max_model_len)
        self.journal = journal

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

    @property
    def eos_token_id(self) -> int | None:
        return self._tokenizer.eos_token_id

    def generate(self, requests: list[GenRequest], topk: int, progress: ProgressFn | None = None) -> list[GenResult]:
        from vllm import SamplingParams

        settings: list[dict[str, Any]] = [
            dict(**r.sampler(), max_tokens=r.max_tokens, stop=list(r.stop) or None, logprobs=topk) for r in requests
        ]
        keys = [request_key("offline:generate", {"prompt_token_ids": r.prompt_token_ids, **s})
                for r, s in zip(requests, settings)]
        calls = JournaledCalls(keys, self.journal, GenResult, progress)
        params = [SamplingParams(**s) for s in settings]
        self._stream(calls, calls.todo(), lambda i: {"prompt_token_ids": requests[i].prompt_token_ids},
                     lambda i: params[i], lambda i, out: self._generated(out, topk))
        return calls.results()

    @staticmethod
    def _generated(out: Any, topk: int) -> GenResult:
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
        return GenResult(text=comp.text, token_ids=ids, logprobs=logprobs, topk_ids=top_ids,
                         topk_logprobs=top_lps, finish_reason=str(comp.finish_reason))

    def score(
        self, requests: list[ScoreRequest], progress: ProgressFn | None = None, topk: int = 1
    ) -> list[ScoreResult]:
        from vllm import SamplingParams

        # max_tokens=1 is the least decode vLLM allows; prompt_logprobs=1 gives each
        # position's argmax beside the actual token, enough for lm-eval's is_greedy.
        # Teacher forcing asks for the variant's own top-k at every forced position.
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=max(1, topk))
        keys = [request_key("offline:score", {"token_ids": r.token_ids, "scored": list(r.scored()), "topk": topk})
                for r in requests]
        calls = JournaledCalls(keys, self.journal, ScoreResult, progress)
        todo = calls.todo()
        # vLLM returns every prompt position's top-k as Python objects; sending the work
        # in slices of a bounded token count keeps that transient memory bounded too,
        # and only the asked-for positions are kept of each answer.
        for lo, hi in token_budget_slices([len(requests[i].token_ids) for i in todo], SCORE_TOKENS_PER_CALL):
            self._stream(calls, todo[lo:hi], lambda i: {"prompt_token_ids": requests[i].token_ids},
                         lambda i: params, lambda i, out: self._scored(requests[i], out, topk))
        return calls.results()

    def _stream(self, calls: JournaledCalls, todo: list[int], prompt: Callable[[int], Any], params: Callable[[int], Any],
                convert: Callable[[int, Any], Any]) -> None:
        """Requests ``todo`` (indices into ``calls``) through the engine, each result handed
        to ``calls`` as its request finishes. The same queue and step loop as
        ``LLM.generate``, so the engine forms the same batches as it would there."""
        if not todo:
            return
        if not hasattr(self._llm, "enqueue"):  # an older vLLM: the answers arrive all at once
            outputs = self._llm.generate([prompt(i) for i in todo], [params(i) for i in todo],
                                         use_tqdm=_progress_bar_factory(calls.progress_within()))
            for i, out in zip(todo, outputs):
                calls.finished(i, convert(i, out), counted=True)  # the bar counted them as they finished
            return
        ids = self._llm.enqueue([prompt(i) for i in todo], [params(i) for i in todo], use_tqdm=False)
        index = dict(zip(ids, todo))
        # enqueue returns the engine's own ids, "<request id>-<8 random characters>" in
        # recent vLLM, while outputs carry the request id itself
        index.update({rid.rsplit("-", 1)[0]: i for rid, i in zip(ids, todo)})
        engine = self._llm.llm_engine
        while engine.has_unfinished_requests():
            for step_out in engine.step():
                if step_out.finished:
                    i = index[step_out.request_id]
                    calls.finished(i, convert(i, step_out))

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

    def info(self) -> EngineInfo:
        # the journal's summary is the worker's to add, once, as the variant ends
        return EngineInfo(kind="offline", max_model_len=self._max_model_len)

    def counters(self) -> dict[str, float] | None:
        if self._llm.llm_engine.log_stats is False:  # the config turned stat logging off
            return None
        return engine_counters.in_process()

    def close(self) -> None:
        """Stop vLLM's engine-core process now, not during interpreter teardown."""
        super().close()
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


class JournaledCalls:
    """One engine call's results, in request order: those the journal already holds,
    then each one as it finishes (appended to the journal, counted as progress)."""

    def __init__(self, keys: list[str], journal: RequestJournal | None, result_type: type,
                 progress: ProgressFn | None):
        self._keys, self._journal, self._progress = keys, journal, progress
        answers = [journal.get(k) if journal is not None else None for k in keys]
        self._results: list[Any] = [result_type(**a) if a is not None else None for a in answers]
        self._done = sum(r is not None for r in self._results)
        if progress is not None and self._done:
            progress(self._done, len(keys))

    def todo(self) -> list[int]:
        return [i for i, r in enumerate(self._results) if r is None]

    def finished(self, i: int, result: Any, counted: bool = False) -> None:
        """``counted``: its progress was reported already (progress_within)."""
        self._results[i] = result
        if self._journal is not None:
            self._journal.put(self._keys[i], vars(result))  # its fields; json writes the nested lists as they are
        self._done += 1
        if self._progress is not None and not counted:
            self._progress(self._done, len(self._keys))

    def progress_within(self) -> ProgressFn | None:
        """Progress of a sub-call, counted on top of what is done."""
        if self._progress is None:
            return None
        base, total, progress = self._done, len(self._keys), self._progress
        return lambda done, _n: progress(base + done, total)

    def results(self) -> list[Any]:
        assert all(r is not None for r in self._results), "the engine left requests unanswered"
        return self._results


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


def in_order(call: Callable[[list], list], requests: list, reverse: bool) -> list:
    """``call(requests)``, sending the requests in reverse order when asked (the A/A
    run: the engine forms other batches from the same work); results in input order."""
    return call(requests[::-1])[::-1] if reverse else call(requests)


def decode_each(engine: Engine, token_ids: Sequence[int]) -> list[str]:
    """Each token's own text (for reports' context), decoding every distinct id once."""
    distinct = sorted(set(token_ids))
    texts = dict(zip(distinct, engine.decode_many([[tid] for tid in distinct])))
    return [texts[tid] for tid in token_ids]
