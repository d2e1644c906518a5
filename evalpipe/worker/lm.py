"""evalpipe's lm-eval model: carries every request through the engine and keeps its tokens.

lm-eval's own vLLM class keeps only the text of each generation (and cannot start
on the CPU build: it asks for the `vllm` distribution's version). This class sends
all of a call's requests to the engine at once, so the engine batches them as it
would in serving, and records for every generated position the token id, its
logprob and the top-k alternatives, keyed by (task, doc_id, request idx, repeat).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from evalpipe.config.run_config import RequestSchedule
from evalpipe.config.sampling import Sampling, sample_seed
from evalpipe.worker.engines import Draw, Engine, GenRequest, GenResult, ScoreRequest, in_order

CaptureKey = tuple[str, int, int, int]  # task, doc_id, request idx, repeat
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own fallback when a task sets none


def waves(n: int, schedule: RequestSchedule) -> list[tuple[int, int]]:
    """The (lo, hi) slices of ``n`` requests that go to the engine one after another."""
    if n == 0:
        return []
    if schedule == "one_at_a_time":
        return [(i, i + 1) for i in range(n)]
    if schedule == "prime_first" and n > 1:
        return [(0, 1), (1, n)]
    return [(0, n)]


@dataclass
class Capture:
    prompt_token_ids: list[int]
    truncated_prompt: bool
    result: GenResult
    draw: Draw | None = None  # how it was sampled; None: greedy


class CapturingLM(LM):
    def __init__(
        self,
        engine: Engine,
        topk: int,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        progress: Callable[[str, int, int], None] | None = None,
        reverse_order: bool = False,
    ):
        super().__init__()
        self.engine = engine
        # The A/A noise-floor run sends each call's requests in reverse order, so the
        # engine forms different batches from the same work.
        self.reverse_order = reverse_order
        self.topk = topk
        self.max_gen_toks = max_gen_toks
        self.progress = progress
        self.captures: dict[CaptureKey, Capture] = {}
        self.sampling_overridden: set[str] = set()
        # the current task's `sampling:` (the worker sets it per task; its seed resolved); None: greedy
        self.sampling: Sampling | None = None
        self.schedule: RequestSchedule = "together"  # the current task's, set by the worker as sampling is
        self.engine_seconds = 0.0  # time inside engine calls, incl. converting their logprobs
        self.tokenize_seconds = 0.0  # prompts to ids
        # When the current task's first request reached the LM (lm-eval has built them by
        # then); the worker resets it per task. Time from here on is the serving part.
        self.first_request_at: float | None = None

    def _first_request(self) -> None:
        # max_model_len connects to a server that is still starting: waiting for it is
        # engine start, so the clock starts after it
        _ = self.engine.max_model_len
        if self.first_request_at is None:
            self.first_request_at = time.time()

    def _ordered(self, call: Callable[[list], list], requests: list) -> list:
        return in_order(call, requests, self.reverse_order)

    def _report(self, phase: str, total: int, done: int = 0) -> Callable[[int, int], None] | None:
        """An engine call's progress, opened with ``done/total`` as its requests are handed to the
        engine: from then on the silence is the engine's, which the no-progress watchdog times
        (lm-eval's request building and the tokenizing before it are not). ``done``: requests
        of the same lm-eval call an earlier wave answered (the counts run over the whole call)."""
        progress = self.progress  # set once, in __init__
        if progress is None:
            return None
        progress(phase, done, total)
        return lambda answered, _n: progress(phase, done + answered, total)

    # -- generation -----------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        seen: Counter[tuple[str, int, int]] = Counter()
        keys: list[CaptureKey] = []
        gen_requests: list[GenRequest] = []
        truncated: list[bool] = []
        self._first_request()
        t0 = time.perf_counter()
        encoded = self.engine.encode_many([inst.args[0] for inst in requests])
        self.tokenize_seconds += time.perf_counter() - t0
        for inst, ids in zip(requests, encoded):
            context, gen_kwargs = inst.args
            gen_kwargs = dict(gen_kwargs or {})
            if self.sampling is None and (gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature", 0.0) or 0.0) > 0):
                # Greedy unless the run config asks for seeded sampling: a task's own sampling
                # has no common random numbers, so two variants' samples would differ by chance.
                self.sampling_overridden.add(inst.task_name)
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            budget = max(self.engine.max_model_len - max_tokens, 1)
            truncated.append(len(ids) > budget)
            ids = ids[-budget:]
            base = (inst.task_name, int(inst.doc_id), int(inst.idx))
            keys.append((*base, seen[base]))
            gen_requests.append(
                GenRequest(prompt_token_ids=ids, max_tokens=max_tokens, stop=until, label=f"{inst.task_name} doc {inst.doc_id}",
                           draw=self._draw(*base, seen[base]))
            )
            seen[base] += 1

        t0 = time.perf_counter()
        results = self._scheduled("generate", lambda reqs, report: self.engine.generate(reqs, self.topk, progress=report),
                                  gen_requests)
        self.engine_seconds += time.perf_counter() - t0
        for key, req, cut, res in zip(keys, gen_requests, truncated, results):
            self.captures[key] = Capture(prompt_token_ids=req.prompt_token_ids, truncated_prompt=cut, result=res, draw=req.draw)
        return [res.text for res in results]

    def _scheduled(self, phase: str, call: Callable[[list, Any], list], requests: list) -> list:
        """The requests through the engine (in reverse order for the A/A run) in the task's
        schedule's waves: one engine call each, the next once the last finished, their progress
        counted over the whole lm-eval call."""
        def in_waves(ordered: list) -> list:
            results: list = []
            for lo, hi in waves(len(ordered), self.schedule):
                results += call(ordered[lo:hi], self._report(phase, len(ordered), done=lo))
            return results

        return self._ordered(in_waves, requests)

    def _draw(self, task: str, doc_id: int, request: int, sample: int) -> Draw | None:
        """The sample's sampler and seed (lm-eval's repeats of a request are its samples), or None: greedy."""
        if self.sampling is None:
            return None
        s = self.sampling
        base = 0 if s.seed is None else s.seed
        return Draw(temperature=s.temperature, top_p=s.top_p, top_k=s.vllm_top_k, min_p=s.min_p,
                    seed=sample_seed(base, task, doc_id, request, sample))

    # -- likelihoods (multiple-choice and perplexity tasks) ---------------------------
    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # Same split as lm-eval's own models: trailing spaces of the context belong to
        # the continuation, so " B" is scored as one token where the tokenizer says so.
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.engine.encode(context + continuation)
        context_ids = self.engine.encode(context)
        return context_ids, whole[len(context_ids) :]

    def _prefix_token(self) -> int:
        eos = self.engine.eos_token_id
        return int(eos) if eos is not None else 0

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._first_request()
        score_requests = []
        for inst in requests:
            context, continuation = inst.args
            if context:
                context_ids, cont_ids = self._encode_pair(context, continuation)
            else:
                context_ids, cont_ids = [self._prefix_token()], self.engine.encode(continuation)
            ids = (context_ids + cont_ids)[-(self.engine.max_model_len) :]
            score_requests.append(
                ScoreRequest(token_ids=ids, start=len(ids) - len(cont_ids), label=f"{inst.task_name} doc {inst.doc_id}")
            )
        t0 = time.perf_counter()
        scored = self._scheduled("loglikelihood", lambda reqs, report: self.engine.score(reqs, progress=report), score_requests)
        self.engine_seconds += time.perf_counter() - t0
        return [(float(sum(s.logprobs)), bool(all(s.is_greedy))) for s in scored]

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        self._first_request()
        windows: list[ScoreRequest] = []
        owner: list[int] = []
        for i, inst in enumerate(requests):
            (text,) = inst.args
            for context, target in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.engine.encode(text),
                    prefix_token=self._prefix_token(),
                    max_seq_len=self.engine.max_model_len - 1,
                    context_len=1,
                ),
            ):
                ids = list(context) + list(target)
                windows.append(ScoreRequest(token_ids=ids, start=len(context), label=f"{inst.task_name} doc {inst.doc_id}"))
                owner.append(i)
        totals = [0.0] * len(requests)
        scored = self._scheduled("loglikelihood_rolling", lambda reqs, report: self.engine.score(reqs, progress=report), windows)
        for i, s in zip(owner, scored):
            totals[i] += float(sum(s.logprobs))
        return totals

    # -- lm-eval bookkeeping ----------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return "evalpipe-engine"

    def get_model_info(self) -> dict[str, Any]:
        return {"engine": self.engine.info().model_dump(mode="json"), "topk": self.topk}
