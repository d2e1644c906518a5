"""The engine behind a variant when it is a vLLM OpenAI server (serve and endpoint modes).

Same interface and same capture as the in-process engine (engines.py): prompts go as
token ids, generated tokens come back as ids (`return_tokens_as_token_ids`: text keys
collide when two ids decode alike) with the top-k of every position, teacher forcing
uses `prompt_logprobs` on exact ids, and temperature and seed are always sent (a
server's defaults come from the model's generation_config.json). Tokenizing uses the
model's tokenizer here, loaded by vLLM's own loader, when its files are on this
machine (one HTTP round trip per prompt cost 20x the tokenizing itself); every batch
is checked against the server's /tokenize on its first text, and at the first
disagreement (or without local files) the server tokenizes everything.

A request is retried (with backoff) only after a transport error; an HTTP error or a
malformed answer fails the variant at once, naming the request. An empty answer is
never scored as wrong.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any, Awaitable, Callable, Sequence

import httpx

from evalpipe.documents.manifest import EngineInfo, ServerInfo
from evalpipe.documents.worker_job import ServerJob
from evalpipe.errors import RunFailed
from evalpipe.worker import engine_counters
from evalpipe.worker.engines import GenRequest, GenResult, ProgressFn, ScoreRequest, ScoreResult, ranked_topk
from evalpipe.worker.journal import RequestJournal, request_key

TOKEN_ID_PREFIX = "token_id:"


class ServerError(RunFailed):
    """The server could not be reached, refused a request or answered nonsense."""




def wait_ready(settings: ServerJob, on_wait: Callable[[float], None] | None = None, poll_s: float = 1.0) -> None:
    """Poll /health until it answers 200. vLLM binds its port before the engine is up
    and refuses connections until then; 503 means its engine died."""
    deadline = time.monotonic() + settings.ready_timeout_s
    started = time.monotonic()
    last_error = "no answer"
    with httpx.Client(base_url=settings.url, timeout=10.0, headers=settings.headers()) as client:
        while time.monotonic() < deadline:
            try:
                reply = client.get("/health")
                if reply.status_code == 200:
                    return
                last_error = f"/health answered {reply.status_code}"
            except httpx.TransportError as err:
                last_error = f"{type(err).__name__}"
            if on_wait is not None:
                on_wait(time.monotonic() - started)
            time.sleep(poll_s)
    raise ServerError(
        f"the server at {settings.shown_url} was not ready within {settings.ready_timeout_s:.0f}s ({last_error}); "
        "raise launch.ready_timeout_s if the model needs longer to start, or check the server's log."
    )


def _local_tokenizer(path: str | None, args: dict[str, Any]) -> Any | None:
    """The tokenizer the server loads, loaded here by the same vLLM function; None when
    its files are not on this machine or this interpreter has no vLLM."""
    if not path or not os.path.isdir(path):
        return None
    try:
        try:
            from vllm.tokenizers import get_tokenizer
        except ImportError:  # older vLLM; the checker takes the fallback import of the same function for a second definition
            from vllm.transformers_utils.tokenizer import get_tokenizer  # type: ignore[no-redef]
        return get_tokenizer(path, tokenizer_mode=args.get("tokenizer_mode") or "auto",
                             trust_remote_code=bool(args.get("trust_remote_code")), revision=args.get("tokenizer_revision"))
    except Exception:  # noqa: BLE001 - the server tokenizes instead
        return None


def _topk_from_generated(position: dict[str, float] | None, k: int) -> tuple[list[int], list[float]]:
    """The k best of one generated position. The server lists the chosen token first,
    then the top k by rank; a stable sort by logprob keeps that rank order on ties."""
    if not position:
        return [], []
    entries = [(_token_id(key), float(lp)) for key, lp in position.items()]
    entries.sort(key=lambda e: -e[1])
    entries = entries[:k]
    return [tid for tid, _ in entries], [lp for _, lp in entries]


def _topk_from_prompt(position: dict[str, Any], k: int) -> tuple[list[int], list[float]]:
    """The k best of one prompt position, chosen as the offline engine chooses them."""
    return ranked_topk(((int(tid), e.get("rank"), e["logprob"]) for tid, e in position.items()), k)


def _token_id(key: str) -> int:
    if not key.startswith(TOKEN_ID_PREFIX):
        raise ServerError(f"the server returned token {key!r} instead of `token_id:N`; it ignores return_tokens_as_token_ids (vLLM too old?)")
    return int(key[len(TOKEN_ID_PREFIX):])


class HttpEngine:
    """A running vLLM OpenAI server, used as an `Engine`.

    With ``lazy``, nothing is asked of the server until the first request needs it, so
    lm-eval builds its requests (documents, few-shot contexts) while the server is
    still loading the model; ``ready_wait_s`` is the time then spent waiting for it (and
    loading the tokenizer): engine start, not task time."""

    def __init__(self, settings: ServerJob, on_wait: Callable[[float], None] | None = None, lazy: bool = False,
                 journal: RequestJournal | None = None):
        self.settings = settings
        self._on_wait = on_wait
        self.journal = journal  # completions answered before a kill are not asked again
        self._client: httpx.Client | None = None
        self.ready_wait_s: float | None = None
        if not lazy:
            self._connect()

    def _connect(self) -> None:
        if self._client is not None:
            return
        settings = self.settings
        t0 = time.monotonic()
        wait_ready(settings, self._on_wait)
        self._client = httpx.Client(base_url=settings.url, timeout=settings.request_timeout_s, headers=settings.headers())
        models = self._get("/v1/models")["data"]
        names = [m["id"] for m in models]
        if settings.model is None:
            if len(names) != 1:
                raise ServerError(f"the server at {settings.shown_url} serves {len(names)} models ({', '.join(names)}); set launch.served_model_name to one of them.")
            self.model = names[0]
        elif settings.model not in names:
            raise ServerError(f"the server at {settings.shown_url} does not serve `{settings.model}` (it serves: {', '.join(names)}); fix launch.served_model_name.")
        else:
            self.model = settings.model
        card = next(m for m in models if m["id"] == self.model)
        self._max_model_len = int(card["max_model_len"])
        version = self._try_get("/version")
        self._server = ServerInfo(url=settings.shown_url, models=models, version=version if isinstance(version, dict) else None)
        self._eos: int | None | bool = False  # not asked yet
        self._local = _local_tokenizer(settings.tokenizer, settings.tokenizer_args or {})
        self.tokenized_by = "local" if self._local is not None else "server"
        self.ready_wait_s = time.monotonic() - t0  # the server's start and the tokenizer's load

    # -- plumbing --------------------------------------------------------------------
    def _get(self, path: str) -> Any:
        assert self._client is not None
        reply = self._client.get(path)
        if reply.status_code != 200:
            raise ServerError(f"GET {self.settings.shown_url}{path} answered {reply.status_code}: {reply.text[:300]}")
        return reply.json()

    def _try_get(self, path: str) -> Any:
        try:
            return self._get(path)
        except (ServerError, httpx.HTTPError, ValueError):
            return None

    async def _post_all(self, path: str, bodies: list[dict[str, Any]], progress: ProgressFn | None,
                        labels: Sequence[str]) -> list[Any]:
        """POST every body with at most `concurrency` in flight; answers in input order.
        Completions go through the journal; tokenizing is cheap and is asked again."""
        limit = asyncio.Semaphore(self.settings.concurrency)
        journal = self.journal if path == "/v1/completions" else None
        done = 0
        limits = httpx.Limits(max_connections=self.settings.concurrency, max_keepalive_connections=self.settings.concurrency)
        async with httpx.AsyncClient(base_url=self.settings.url, timeout=self.settings.request_timeout_s,
                                     headers=self.settings.headers(), limits=limits) as client:

            async def one(body: dict[str, Any], label: str) -> Any:
                nonlocal done
                key = request_key(path, body) if journal is not None else None
                answer = journal.get(key) if journal is not None and key is not None else None
                if answer is None:
                    async with limit:
                        answer = await self._with_retries(lambda: client.post(path, json=body), label)
                    if journal is not None and key is not None:
                        journal.put(key, answer)
                done += 1
                if progress is not None:
                    progress(done, len(bodies))
                return answer

            tasks = [asyncio.ensure_future(one(body, label)) for body, label in zip(bodies, labels)]
            try:
                return await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()

    async def _with_retries(self, send: Callable[[], Awaitable[httpx.Response]], label: str) -> Any:
        for attempt in range(self.settings.retries + 1):
            try:
                reply = await send()
            except httpx.TransportError as err:
                if attempt == self.settings.retries:
                    raise ServerError(
                        f"{label}: no answer from {self.settings.shown_url} after {attempt + 1} attempts "
                        f"({type(err).__name__}: {err}); the server may have died, see its log"
                    ) from None
                await asyncio.sleep(min(2.0 ** attempt, 30.0))
                continue
            if reply.status_code != 200:
                raise ServerError(f"{label}: the server answered {reply.status_code}: {reply.text[:300]}")
            return reply.json()
        raise AssertionError("unreachable")

    # -- Engine interface -----------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.encode_many([text])[0]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.decode_many([token_ids])[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        self._connect()
        if self._local is not None and texts:
            local = [list(self._local.encode(t, add_special_tokens=False)) for t in texts]
            if local[0] == self._server_encode(texts[:1])[0]:
                return local
            self._local, self.tokenized_by = None, "server (the local tokenizer disagreed with it)"
        return self._server_encode(texts)

    def _server_encode(self, texts: Sequence[str]) -> list[list[int]]:
        bodies = [{"model": self.model, "prompt": t, "add_special_tokens": False} for t in texts]
        answers = asyncio.run(self._post_all("/tokenize", bodies, None, [f"tokenizing text {i}" for i in range(len(texts))]))
        return [list(a["tokens"]) for a in answers]

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        self._connect()
        if self._local is not None:
            return [self._local.decode(list(s)) for s in sequences]
        bodies = [{"model": self.model, "tokens": list(s)} for s in sequences]
        answers = asyncio.run(self._post_all("/detokenize", bodies, None, [f"detokenizing sequence {i}" for i in range(len(sequences))]))
        return [a["prompt"] for a in answers]

    @property
    def max_model_len(self) -> int:
        self._connect()
        return self._max_model_len

    @property
    def eos_token_id(self) -> int | None:
        self._connect()
        if self._local is not None:
            return self._local.eos_token_id
        if self._eos is False:
            info = self._try_get("/tokenizer_info")
            self._eos = (info or {}).get("eos_token_id")
            if self._eos is None:
                raise ServerError(
                    "this task needs the tokenizer's end-of-sequence id, which the server does not tell: "
                    "start it with --enable-tokenizer-info-endpoint"
                )
        return self._eos

    def generate(self, requests: list[GenRequest], topk: int, progress: ProgressFn | None = None) -> list[GenResult]:
        self._connect()
        bodies = [
            {
                "model": self.model,
                "prompt": r.prompt_token_ids,
                "max_tokens": r.max_tokens,
                "stop": list(r.stop) or None,
                **r.sampler(),
                "logprobs": topk,
                "return_tokens_as_token_ids": True,
                "return_token_ids": True,
            }
            for r in requests
        ]
        labels = [r.label or f"generation request {i}" for i, r in enumerate(requests)]
        answers = asyncio.run(self._post_all("/v1/completions", bodies, progress, labels))
        return [self._generated(a, topk, label) for a, label in zip(answers, labels)]

    @staticmethod
    def _generated(answer: dict[str, Any], topk: int, label: str) -> GenResult:
        try:
            choice = answer["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lp = choice["logprobs"]
            if len(lp["tokens"]) != len(ids) or any(_token_id(t) != i for t, i in zip(lp["tokens"], ids)):
                raise ServerError(f"{label}: the server's logprobs do not follow its token ids")
            top = [_topk_from_generated(pos, topk) for pos in lp["top_logprobs"]]
            return GenResult(
                text=choice["text"],
                token_ids=ids,
                logprobs=[math.nan if x is None else float(x) for x in lp["token_logprobs"]],
                topk_ids=[t[0] for t in top],
                topk_logprobs=[t[1] for t in top],
                finish_reason=str(choice["finish_reason"]),
            )
        except (KeyError, TypeError, IndexError) as err:
            raise ServerError(f"{label}: malformed completion from the server ({type(err).__name__}: {err})") from None

    def score(self, requests: list[ScoreRequest], progress: ProgressFn | None = None, topk: int = 1) -> list[ScoreResult]:
        self._connect()
        k = max(1, topk)
        bodies = [
            {
                "model": self.model,
                "prompt": r.token_ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "seed": 0,
                "prompt_logprobs": k,
            }
            for r in requests
        ]
        labels = [r.label or f"scoring request {i}" for i, r in enumerate(requests)]
        answers = asyncio.run(self._post_all("/v1/completions", bodies, progress, labels))
        return [self._scored(req, a, topk, label) for req, a, label in zip(requests, answers, labels)]

    @staticmethod
    def _scored(req: ScoreRequest, answer: dict[str, Any], topk: int, label: str) -> ScoreResult:
        try:
            positions = answer["choices"][0]["prompt_logprobs"]
            result = ScoreResult(logprobs=[], is_greedy=[])
            for pos in req.scored():
                position = positions[pos]
                chosen = position[str(req.token_ids[pos])]
                result.logprobs.append(float(chosen["logprob"]))
                result.is_greedy.append(chosen["rank"] == 1)
                t_ids, t_lps = _topk_from_prompt(position, topk)
                result.topk_ids.append(t_ids)
                result.topk_logprobs.append(t_lps)
            return result
        except (KeyError, TypeError, IndexError) as err:
            raise ServerError(f"{label}: malformed prompt logprobs from the server ({type(err).__name__}: {err})") from None

    def info(self) -> EngineInfo:
        self._connect()
        # the journal's summary is the worker's to add, once, as the variant ends
        return EngineInfo(kind="http", max_model_len=self._max_model_len, model=self.model,
                          server=self._server, ready_wait_s=self.ready_wait_s,
                          tokenized_by=self.tokenized_by)

    def counters(self) -> dict[str, float] | None:
        """The server's counters from its ``/metrics`` (None: it has no such route, or is gone)."""
        self._connect()
        assert self._client is not None
        try:
            reply = self._client.get("/metrics")
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        try:
            return engine_counters.parse_exposition(reply.text)
        except ValueError:  # not Prometheus' text format: another server on that route
            return None

    def close(self) -> None:
        """Only the connection: whoever started the server stops it."""
        if self._client is not None:
            self._client.close()
        if self.journal is not None:
            self.journal.close()
