"""A fake engine for the tests of everything around the engine (runner, resume, watchdog,
interrupts, nightly): the `Engine` interface without vLLM, answering in milliseconds.

Test-only, and chosen only by the environment: a worker whose environment sets
``EVALPIPE_FAKE_ENGINE`` (to ``1`` or to behaviours, below) runs this engine in place of
vLLM for an offline variant; run configs have no setting for it (a variant's ``env:`` can
only name the variable). Its manifest's engine says ``"kind": "fake"``, its log
``FAKE ENGINE`` and the path probes ``FakeEngine``, so no artifact of it can pass for a
real run's.

The "model" is a deterministic function of the tokens so far: bytes are tokens (0..255,
EOS 256), and each position's next-token distribution (its top-k, their logprobs, the
argmax) comes from a 64-bit hash of the prefix. Decoding and scoring the same sequence
therefore give the same logprobs, as a real engine's teacher forcing must. Where the
answer "starts" (the earliest end, ``diverge=K``) is read from the prefix too: the
length of its trailing run of the tokens the fake writes (lower-case letters, digits,
spaces), which after a prompt ending otherwise (GSM8K's ``Answer:``) is the number of
tokens generated so far. A server that sees only token ids (server.py) therefore
answers as this engine does offline.

Behaviours, comma-separated in ``EVALPIPE_FAKE_ENGINE`` (a variant's ``env:`` sets its own):

  diverge=K       from the K-th generated token on (the K-th of the trailing run above),
                  another distribution: a variant whose outputs differ from the reference's
  delay=S         S seconds per request (a slow engine, for interrupts)
  hang_after=N    after N answered requests, never answer again (for the watchdog)
  exit_after=N    after N answered requests, the process ends: with exit=CODE (default 3)
                  or signal=NAME (e.g. KILL, SEGV)
  hold=PATH       after one answered request, answer no other until the file PATH exists:
                  a point a test controls (kill the variant there, or let it go on)
  fail_start      the engine fails to start
  unseeded        a sampler that ignores the request's seed: its noise follows the order the
                  engine draws in (a sampler drawing per batch), so the same seed gives
                  other samples in another batch arrangement
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from evalpipe.documents.manifest import EngineInfo
from evalpipe.probes import runtime as probes
from evalpipe.probes.record import ModelRecord
from evalpipe.worker.engines import Draw, GenRequest, GenResult, InProcessEngine, JournaledCalls, ProgressFn, ScoreRequest, ScoreResult
from evalpipe.worker.journal import RequestJournal, request_key

FAKE_ENGINE_ENV = "EVALPIPE_FAKE_ENGINE"
EOS = 256
VOCAB = 257
# what the fake "model" writes: lower-case words, digits, spaces (always valid UTF-8)
ALPHABET = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz0123456789    "]
WRITTEN = frozenset(ALPHABET)
TOP_CANDIDATES = 20  # the most top-k a request can ask for
MASK = (1 << 64) - 1


def setting(env: Mapping[str, str] | None = None) -> str | None:
    """``EVALPIPE_FAKE_ENGINE``'s value (``env``: this process's environment) when it asks
    for the fake, None when it is unset, empty or 0. The one place the variable is read:
    the engine table's fake entry (worker/engine_choice.py) and the fake server ask here."""
    value = (os.environ if env is None else env).get(FAKE_ENGINE_ENV, "")
    return value if value.strip() not in ("", "0") else None


def requested(env: Mapping[str, str] | None = None) -> bool:
    return setting(env) is not None


@dataclass(frozen=True)
class Behaviour:
    diverge_at: int | None = None
    delay_s: float = 0.0
    hang_after: int | None = None
    exit_after: int | None = None
    exit_code: int = 3
    exit_signal: str | None = None
    hold: str | None = None
    fail_start: bool = False
    unseeded: bool = False

    @classmethod
    def parse(cls, text: str) -> Behaviour:
        """``EVALPIPE_FAKE_ENGINE``'s value; a word it does not know is an error (a test's typo
        must not pass as the plain engine)."""
        fields: dict[str, Any] = {}
        names = {"diverge": ("diverge_at", int), "delay": ("delay_s", float), "hang_after": ("hang_after", int),
                 "exit_after": ("exit_after", int), "exit": ("exit_code", int), "signal": ("exit_signal", str),
                 "hold": ("hold", str)}
        for word in (w.strip() for w in text.split(",")):
            if word in ("", "1", "on"):
                continue
            if word in ("fail_start", "unseeded"):
                fields[word] = True
                continue
            key, _, value = word.partition("=")
            if key not in names or not value:
                raise RuntimeError(f"{FAKE_ENGINE_ENV}: unknown behaviour {word!r}; known: 1, fail_start, unseeded, "
                                   + ", ".join(f"{k}=..." for k in names))
            field_name, kind = names[key]
            fields[field_name] = kind(value)
        return cls(**fields)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit value from any 64-bit value."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _step(state: int, token: int) -> int:
    """The prefix hash after one more token (FNV-1a over token ids)."""
    return ((state ^ (token + 1)) * 0x100000001B3) & MASK


PREFIX_START = 0xCBF29CE484222325


def _run(run: int, token: int) -> int:
    """The prefix's trailing run of written tokens (``produced`` below) after one more token."""
    return run + 1 if token in WRITTEN else 0


@dataclass(frozen=True)
class Position:
    """One position's next-token distribution: the candidates best first, their logprobs."""

    ids: list[int]
    logprobs: list[float]
    state: int

    def logprob_of(self, token: int) -> float:
        if token in self.ids:
            return self.logprobs[self.ids.index(token)]
        # below every candidate, different per token
        return self.logprobs[-1] - 1.0 - (_mix(self.state ^ (token * 0x9E37)) % 1000) / 1000.0


def position(state: int, produced: int, diverge_at: int | None) -> Position:
    """The distribution after a prefix with hash ``state`` whose trailing run of written
    tokens is ``produced`` long (a diverging variant draws from another stream from
    ``diverge_at`` on)."""
    salt = 0x5EED if diverge_at is not None and produced >= diverge_at else 0
    r = _mix(state ^ salt)
    ids: list[int] = []
    k = 0
    # ends after 8 tokens at the earliest, about one in 24 positions after that
    if produced >= 8 and r % 24 == 0:
        ids.append(EOS)
    while len(ids) < TOP_CANDIDATES:
        k += 1
        tid = ALPHABET[_mix(r + k) % len(ALPHABET)] if len(ids) < 4 else _mix(r + k) % VOCAB
        if tid not in ids:
            ids.append(tid)
    logprobs, lp = [], -((r >> 8) % 1000) / 2000.0  # the best in (-0.5, 0]
    for i in range(len(ids)):
        logprobs.append(lp)
        lp -= 0.25 + ((r >> (i % 48)) % 1000) / 1000.0
    return Position(ids, logprobs, r)


def sampled(pos: Position, draw: Draw, step: int) -> int:
    """The candidate a seeded sampler picks at generation step ``step``: Gumbel-max over the
    tempered, truncated candidates, the noise of each candidate a hash of (seed, step, id)
    as vLLM's V2 sampler keys it, so the same seed picks the same token wherever the
    distributions agree, whatever the batch."""
    logits = [lp / draw.temperature for lp in pos.logprobs[: draw.top_k or None]]
    probs = [math.exp(x - logits[0]) for x in logits]  # candidates are best first
    total = sum(probs)
    kept, mass = 0, 0.0
    while kept < len(probs) and (mass < draw.top_p * total or kept == 0):
        mass += probs[kept]
        kept += 1
    keep = [i for i in range(kept) if probs[i] >= draw.min_p * probs[0]]

    def noise(tid: int) -> float:
        u = (_mix(_mix(draw.seed) ^ _mix(step + 1) ^ (tid * 0x9E37)) + 0.5) / 2.0**64
        return -math.log(-math.log(u))

    return pos.ids[max(keep, key=lambda i: logits[i] + noise(pos.ids[i]))]


class FakeEngine(InProcessEngine):
    def __init__(self, engine_args: dict[str, Any], behaviour: Behaviour, journal: RequestJournal | None = None):
        if behaviour.fail_start:
            raise RuntimeError("the fake engine was told to fail at start (fail_start)")
        self._behaviour = behaviour
        # byte tokens make prompts several times longer than a real tokenizer's: a window
        # no task here reaches, rather than truncated prompts
        self._max_model_len = max(int(engine_args.get("max_model_len") or 0), 1 << 16)
        self.journal = journal
        self._answered = 0
        self._sampled = 0  # sampled requests so far (the `unseeded` sampler's noise)
        # what the path probes see: this class as the model this process built, one forward
        # pass per request (so a comparison of fake variants is judged on its outputs)
        self._probed = ModelRecord(f"{FakeEngine.__module__}.{FakeEngine.__qualname__}", {}, [])
        record = probes.record()
        if record is not None:
            record.models.append(self._probed)
            probes.flush()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    @property
    def eos_token_id(self) -> int | None:
        return EOS

    # -- scripted behaviour ------------------------------------------------------------
    def _answer(self) -> None:
        """Called before each request is answered: the behaviour's delay, hang or exit."""
        b = self._behaviour
        if b.hang_after is not None and self._answered >= b.hang_after:
            print(f"fake engine: hanging after {self._answered} requests (hang_after)", flush=True)
            while True:
                time.sleep(3600)
        if b.exit_after is not None and self._answered >= b.exit_after:
            print(f"fake engine: ending the process after {self._answered} requests (exit_after)", flush=True)
            if b.exit_signal:
                os.kill(os.getpid(), getattr(signal, "SIG" + b.exit_signal.upper().removeprefix("SIG")))
                time.sleep(60)  # a signal the process survives: never answer
            os._exit(b.exit_code)
        if b.hold is not None and self._answered >= 1 and not os.path.exists(b.hold):
            print(f"fake engine: holding after {self._answered} request(s) until {b.hold} exists (hold)", flush=True)
            while not os.path.exists(b.hold):
                time.sleep(0.05)
        if b.delay_s:
            time.sleep(b.delay_s)
        self._answered += 1

    def _each(self, kind: str, bodies: list[dict[str, Any]], answer, result_type: type,
              progress: ProgressFn | None) -> list[Any]:
        """Each request the journal does not answer, in order, as one forward pass."""
        calls = JournaledCalls([request_key(f"fake:{kind}", body) for body in bodies], self.journal, result_type, progress)
        for i in calls.todo():
            self._answer()
            body = bodies[i]
            record = probes.record()
            snapshot = record.forward_started(self._probed, len(body.get("prompt_token_ids") or body.get("token_ids") or [])) \
                if record is not None else None
            result = answer(i)
            if record is not None:
                record.forward_finished(self._probed, snapshot)
            calls.finished(i, result)
        return calls.results()

    # -- the engine interface ------------------------------------------------------------
    def generate(self, requests: list[GenRequest], topk: int, progress: ProgressFn | None = None) -> list[GenResult]:
        bodies = [{"prompt_token_ids": r.prompt_token_ids, "max_tokens": r.max_tokens, "stop": r.stop, "topk": topk,
                   **({} if r.draw is None else {"draw": r.draw.settings()})} for r in requests]
        return self._each("generate", bodies, lambda i: self._generate_one(requests[i], topk), GenResult, progress)

    def _drawn(self, draw: Draw) -> Draw:
        """The draw as this engine's sampler uses it: ``unseeded`` replaces the seed with the
        number of requests it sampled before (the order its batches came in)."""
        if not self._behaviour.unseeded:
            return draw
        self._sampled += 1
        return dataclasses.replace(draw, seed=self._sampled)

    def _generate_one(self, req: GenRequest, topk: int) -> GenResult:
        state, run = PREFIX_START, 0
        for t in req.prompt_token_ids:
            state, run = _step(state, t), _run(run, t)
        ids: list[int] = []
        lps: list[float] = []
        top_ids: list[list[int]] = []
        top_lps: list[list[float]] = []
        finish = "length"
        while len(ids) < req.max_tokens:
            pos = position(state, run, self._behaviour.diverge_at)
            tid = pos.ids[0] if req.draw is None else sampled(pos, self._drawn(req.draw), len(ids))
            ids.append(tid)
            lps.append(pos.logprobs[0])
            top_ids.append(pos.ids[:topk])
            top_lps.append(pos.logprobs[:topk])
            state, run = _step(state, tid), _run(run, tid)
            if tid == EOS:
                finish = "stop"
                break
            if req.stop and any(s in self.decode(ids) for s in req.stop):
                finish = "stop"
                break
        text = self.decode(ids)
        for s in req.stop:  # as vLLM: the text ends before the stop string
            if s in text:
                text = text[: text.index(s)]
        return GenResult(text=text, token_ids=ids, logprobs=lps, topk_ids=top_ids, topk_logprobs=top_lps,
                         finish_reason=finish)

    def score(self, requests: list[ScoreRequest], progress: ProgressFn | None = None, topk: int = 1) -> list[ScoreResult]:
        bodies = [{"token_ids": r.token_ids, "scored": list(r.scored()), "start": r.start, "topk": topk} for r in requests]
        return self._each("score", bodies, lambda i: self._score_one(requests[i], topk), ScoreResult, progress)

    def _score_one(self, req: ScoreRequest, topk: int) -> ScoreResult:
        wanted = set(req.scored())
        result = ScoreResult(logprobs=[], is_greedy=[])
        found: dict[int, Position] = {}
        state, run = PREFIX_START, 0
        for p, t in enumerate(req.token_ids):
            if p in wanted:
                found[p] = position(state, run, self._behaviour.diverge_at)
            state, run = _step(state, t), _run(run, t)
        for p in req.scored():
            pos = found[p]
            token = req.token_ids[p]
            result.logprobs.append(pos.logprob_of(token))
            result.is_greedy.append(pos.ids[0] == token)
            result.topk_ids.append(pos.ids[:topk])
            result.topk_logprobs.append(pos.logprobs[:topk])
        return result

    def info(self) -> EngineInfo:
        # the journal's summary is the worker's to add, once, as the variant ends
        return EngineInfo(kind="fake", max_model_len=self._max_model_len)


def build_fake_engine(engine_args: dict[str, Any], journal: RequestJournal | None = None,
                      env: Mapping[str, str] | None = None) -> FakeEngine:
    return FakeEngine(engine_args, Behaviour.parse(setting(env) or ""), journal=journal)
