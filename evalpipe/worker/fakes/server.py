"""A fake vLLM OpenAI server for the tests of serve mode's lifecycle (start, readiness,
sharing, signals, a server that dies or hangs), answering in milliseconds.

    python -m evalpipe.worker.fakes.server --config FILE
    python -m evalpipe.worker.fakes.server --model M ... [--headless]   (a deployment's node: vLLM's flags)

Test-only, and reachable only on purpose: a config names this module in a served
variant's ``launch.command`` (its engine arguments, host and port come in the
``--config`` YAML file evalpipe writes, as for ``vllm serve``), and the module refuses
to start unless ``EVALPIPE_FAKE_ENGINE`` is set in its environment. Every trace of it says
fake: /version, /v1/models' ``owned_by``, the first lines of its log, and the path
probes' ``FakeEngine`` model.

The answers are the fake engine's (engine.py), so a served variant on this server
equals the same fake offline token for token; ``EVALPIPE_FAKE_ENGINE``'s behaviours apply
to the server's requests (``hang_after``, ``exit_after`` with a signal, ``fail_start``,
``delay``, ``diverge``). It answers what evalpipe's HTTP engine asks (http_engine.py):
/health, /v1/models, /version, /tokenize, /detokenize, /tokenizer_info and
/v1/completions with token-id prompts, ``logprobs`` and ``prompt_logprobs``. Requests
are answered one at a time (a single engine), each in a thread of its own.

Exit codes: 0 after SIGTERM or SIGINT, 1 when the engine fails to start, 2 when it
was started without ``EVALPIPE_FAKE_ENGINE`` or with a config it cannot read.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from evalpipe.worker.engines import Draw, GenRequest, ScoreRequest
from evalpipe.worker.fakes import rendezvous
from evalpipe.worker.fakes.engine import EOS, FAKE_ENGINE_ENV, TOP_CANDIDATES, Behaviour, FakeEngine, setting

TOKEN_ID_PREFIX = "token_id:"  # the key vLLM uses with return_tokens_as_token_ids
VERSION = {"version": "fake", "server": "evalpipe.worker.fakes.server (tests only, not vLLM)"}
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class _RequestRefused(Exception):
    """A request the server answers with 400 (as vLLM refuses one), with vLLM's wording."""


class FakeServer:
    """The fake engine behind the OpenAI routes; one request at a time."""

    def __init__(self, args: dict[str, Any], engine: FakeEngine):
        self.engine = engine
        served = args.get("served_model_name")
        self.model = str((served[0] if isinstance(served, list) else served) or args["model"])
        self.max_logprobs = int(args.get("max_logprobs") or DEFAULT_MAX_LOGPROBS)
        self.api_key = os.environ.get("VLLM_API_KEY") or args.get("api_key")
        self._lock = threading.Lock()
        self._count = 0
        self.members: rendezvous.HeadRendezvous | None = None  # a deployment's head: the ranks it waits for

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "evalpipe-fake-server",
                                            "root": self.model, "max_model_len": self.engine.max_model_len}]}

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        tokens = self.engine.encode(str(body["prompt"]))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.engine.max_model_len}

    def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": self.engine.decode([int(t) for t in body["tokens"]])}

    def tokenizer_info(self) -> dict[str, Any]:
        return {"tokenizer_class": "FakeByteTokenizer", "eos_token_id": EOS}

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model", self.model) != self.model:
            raise _RequestRefused(f"The model `{body.get('model')}` does not exist.")
        prompt = body["prompt"]
        ids = self.engine.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        for field in ("logprobs", "prompt_logprobs"):
            asked = body.get(field)
            if asked is not None and int(asked) > self.max_logprobs:
                raise _RequestRefused(f"Requested sample logprobs of {asked}, which is greater than max allowed: {self.max_logprobs}")
        with self._lock:  # the fake engine answers one request at a time, as its scripted behaviours count them
            self._count += 1
            if body.get("prompt_logprobs") is not None:
                choice = self._scored(ids, int(body["prompt_logprobs"]))
            else:
                choice = self._generated(ids, body)
            number = self._count
        return {"id": f"cmpl-fake-{number}", "object": "text_completion", "created": 0, "model": self.model,
                "choices": [choice], "usage": {"prompt_tokens": len(ids)}}

    def _generated(self, ids: list[int], body: dict[str, Any]) -> dict[str, Any]:
        k = int(body.get("logprobs") or 0)
        request = GenRequest(prompt_token_ids=ids, max_tokens=int(body.get("max_tokens") or 16), stop=list(body.get("stop") or []),
                             draw=_draw(body))
        (result,) = self.engine.generate([request], topk=k)
        choice: dict[str, Any] = {"index": 0, "text": result.text, "token_ids": result.token_ids,
                                  "finish_reason": result.finish_reason}
        if body.get("logprobs") is not None:
            # vLLM lists the chosen token first, then the top k
            top = [{f"{TOKEN_ID_PREFIX}{chosen}": lp, **{f"{TOKEN_ID_PREFIX}{t}": x for t, x in zip(t_ids, t_lps)}}
                   for chosen, lp, t_ids, t_lps in zip(result.token_ids, result.logprobs, result.topk_ids, result.topk_logprobs)]
            choice["logprobs"] = {"tokens": [f"{TOKEN_ID_PREFIX}{t}" for t in result.token_ids],
                                  "token_logprobs": result.logprobs, "top_logprobs": top}
        return choice

    def _scored(self, ids: list[int], k: int) -> dict[str, Any]:
        """vLLM's prompt_logprobs: None for the first position, then each position's own
        token with its rank and the top k. Every candidate is asked for, for the ranks."""
        (result,) = self.engine.score([ScoreRequest(token_ids=ids, start=1)], topk=TOP_CANDIDATES)
        positions: list[dict[str, Any] | None] = [None]
        for token, lp, cand_ids, cand_lps in zip(ids[1:], result.logprobs, result.topk_ids, result.topk_logprobs):
            rank = cand_ids.index(token) + 1 if token in cand_ids else TOP_CANDIDATES + 1
            entry = {str(token): {"logprob": lp, "rank": rank, "decoded_token": self.engine.decode([token])}}
            for r, (t, x) in enumerate(zip(cand_ids[:k], cand_lps[:k]), start=1):
                entry.setdefault(str(t), {"logprob": x, "rank": r, "decoded_token": self.engine.decode([t])})
            positions.append(entry)
        return {"index": 0, "text": "", "token_ids": [], "finish_reason": "length", "prompt_logprobs": positions}


def handler_for(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "evalpipe-fake-server"

        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            routes = {"/health": lambda: None, "/v1/models": server.models, "/version": lambda: VERSION,
                      "/tokenizer_info": server.tokenizer_info}
            if self.path not in routes:
                return self._reply(404, {"error": f"no route {self.path}"})
            if self.path == "/health" and server.members is not None and not server.members.ready:
                return self._reply(503, {"error": "waiting for data-parallel ranks"})
            if self.path.startswith("/v1/") and not self._authorized():
                return self._reply(401, {"error": "Unauthorized"})
            self._reply(200, routes[self.path]())

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            routes = {"/tokenize": server.tokenize, "/detokenize": server.detokenize, "/v1/completions": server.completion}
            if self.path not in routes:
                return self._reply(404, {"error": f"no route {self.path}"})
            if self.path.startswith("/v1/") and not self._authorized():
                return self._reply(401, {"error": "Unauthorized"})
            try:
                answer = routes[self.path](body)
            except (_RequestRefused, KeyError, TypeError, ValueError) as err:
                return self._reply(400, {"object": "error", "message": f"{type(err).__name__}: {err}", "code": 400})
            self._reply(200, answer)

        def _authorized(self) -> bool:
            return not server.api_key or self.headers.get("Authorization") == f"Bearer {server.api_key}"

        def _reply(self, status: int, answer: Any) -> None:
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            sys.stderr.write(f"fake server: {self.address_string()} {format % args}\n")

    return Handler


def read_args(path: Path) -> dict[str, Any]:
    """The --config file evalpipe writes (vLLM's dashed flag names), with Python names."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict) or "model" not in loaded:
        raise ValueError(f"{path} is not a server config with a `model`")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}



def _draw(body: dict[str, Any]) -> Draw | None:
    """The sampler a completion request asks for, as vLLM's server reads it (temperature 0 or
    absent: greedy; an absent seed: none, which a seeded comparison never sends)."""
    temperature = float(body.get("temperature") or 0.0)
    if temperature <= 0:
        return None
    return Draw(temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=int(body.get("top_k") or 0),
                min_p=float(body.get("min_p") or 0.0), seed=int(body.get("seed") or 0))


def flag_args(words: list[str]) -> dict[str, Any]:
    """vLLM-style flags (`--key value`, `--flag`, `--no-flag`, a JSON word for a mapping) as
    Python names; how a deployment's nodes are started (no --config file on another node)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ValueError(f"unexpected word {word!r}; flags start with --")
        values = []
        while i + 1 < len(words) and not words[i + 1].startswith("--"):
            i += 1
            values.append(yaml.safe_load(words[i]))
        name = word[2:].replace("-", "_")
        if not values and name.startswith("no_"):
            args[name[3:]] = False
        else:
            args[name] = True if not values else values[0] if len(values) == 1 else values
        i += 1
    if "model" not in args:
        raise ValueError("no --model")
    return args


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] in (["-h"], ["--help"]):
        print("usage: python -m evalpipe.worker.fakes.server (--config FILE | vLLM's flags [--headless])\n"
              "A FAKE vLLM OpenAI server for evalpipe's tests (not vLLM).")
        return 0
    value = setting()
    if value is None:
        print(f"evalpipe.worker.fakes.server is a fake server for tests; it starts only with {FAKE_ENGINE_ENV} set "
              "in its environment. To serve a model, remove launch.command (vLLM's server is the default).",
              file=sys.stderr)
        return 2
    try:
        args = read_args(Path(words[1])) if words[:1] == ["--config"] and len(words) == 2 else flag_args(words)
    except (OSError, ValueError, yaml.YAMLError) as err:
        print(f"fake server: cannot read its arguments: {err}", file=sys.stderr)
        return 2
    print(f"FAKE SERVER ({FAKE_ENGINE_ENV}={value}): tests only, not vLLM", flush=True)
    try:
        engine = FakeEngine(args, Behaviour.parse(value))
    except RuntimeError as err:
        print(f"fake server: the engine failed to start: {err}", flush=True)
        return 1
    if args.get("headless"):  # a deployment's other node: no HTTP, its ranks held until the head goes
        signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
        try:
            return rendezvous.run_member(args)
        finally:
            engine.close()
    fake = FakeServer(args, engine)
    fake.members = rendezvous.HeadRendezvous(args)
    host, port = str(args.get("host") or "127.0.0.1"), int(args["port"])
    httpd = ThreadingHTTPServer((host, port), handler_for(fake))
    httpd.daemon_threads = True
    httpd.block_on_close = False  # a hung request must not keep a stopped server alive

    def stop(signum: int, _frame: Any) -> None:
        print(f"fake server: {signal.Signals(signum).name}, shutting down", flush=True)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"fake server: serving {fake.model} on http://{host}:{port}", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        fake.members.close()
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
