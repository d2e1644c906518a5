"""The HTTP engine's reading of vLLM's completion answers (pure; the real server is in
test_e2e_serve.py)."""

from __future__ import annotations

import pytest

from evalpipe.worker.engines import ScoreRequest
from evalpipe.worker.http_engine import HttpEngine, ServerError, _topk_from_generated, _topk_from_prompt


def test_generated_topk_best_first_and_ties_keep_the_servers_rank_order():
    # the server lists the chosen token first, then the top k by rank
    pos = {"token_id:7": -0.5, "token_id:3": -0.5, "token_id:9": -1.25, "token_id:1": -3.0}
    assert _topk_from_generated(pos, 3) == ([7, 3, 9], [-0.5, -0.5, -1.25])
    # a chosen token outside the top k is listed first but does not belong to it
    pos = {"token_id:4": -6.0, "token_id:1": -0.1, "token_id:2": -2.0}
    assert _topk_from_generated(pos, 2) == ([1, 2], [-0.1, -2.0])
    assert _topk_from_generated(None, 2) == ([], [])
    with pytest.raises(ServerError, match="return_tokens_as_token_ids"):
        _topk_from_generated({"hello": -1.0}, 1)


def test_prompt_topk_follows_rank_then_id():
    pos = {"5": {"logprob": -2.0, "rank": 3}, "8": {"logprob": -0.2, "rank": 1}, "2": {"logprob": -1.0, "rank": 2},
           "11": {"logprob": -9.0, "rank": 40}}
    assert _topk_from_prompt(pos, 2) == ([8, 2], [-0.2, -1.0])
    assert _topk_from_prompt(pos, 5) == ([8, 2, 5], [-0.2, -1.0, -2.0])


def test_generated_answer_is_checked_against_its_token_ids():
    answer = {"choices": [{"text": "ab", "token_ids": [4, 5], "finish_reason": "stop",
                           "logprobs": {"tokens": ["token_id:4", "token_id:5"], "token_logprobs": [-0.1, -0.2],
                                        "top_logprobs": [{"token_id:4": -0.1}, {"token_id:5": -0.2, "token_id:6": -3.0}]}}]}
    res = HttpEngine._generated(answer, 2, "gsm8k doc 3")
    assert (res.token_ids, res.logprobs, res.topk_ids) == ([4, 5], [-0.1, -0.2], [[4], [5, 6]])
    answer["choices"][0]["logprobs"]["tokens"] = ["token_id:4", "token_id:9"]
    with pytest.raises(ServerError, match="gsm8k doc 3: the server's logprobs do not follow its token ids"):
        HttpEngine._generated(answer, 2, "gsm8k doc 3")
    with pytest.raises(ServerError, match="gsm8k doc 3: malformed completion"):
        HttpEngine._generated({"choices": []}, 2, "gsm8k doc 3")


def test_scored_positions_and_greedy_flags():
    req = ScoreRequest(token_ids=[1, 2, 3], start=1)
    answer = {"choices": [{"prompt_logprobs": [
        None,
        {"2": {"logprob": -0.5, "rank": 1}},
        {"3": {"logprob": -2.0, "rank": 2}, "7": {"logprob": -0.3, "rank": 1}},
    ]}]}
    res = HttpEngine._scored(req, answer, 1, "doc")
    assert res.logprobs == [-0.5, -2.0] and res.is_greedy == [True, False] and res.topk_ids == [[2], [7]]


class _Counting:
    """A loopback HTTP server that answers every POST with one fixed status, counting them."""

    def __init__(self, status: int):
        import http.server
        import threading

        self.count = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                outer.count += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b'{"error": "refused"}'
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


def _engine(url: str, retries: int) -> HttpEngine:
    from evalpipe.documents.worker_job import ServerJob

    return HttpEngine(ServerJob(url=url, retries=retries, concurrency=2), lazy=True)


def test_an_http_error_fails_at_once_naming_the_request():
    import asyncio

    server = _Counting(400)
    try:
        with pytest.raises(ServerError, match=r"gsm8k doc 17: the server answered 400: .*refused"):
            asyncio.run(_engine(server.url, retries=3)._post_all("/v1/completions", [{}], None, ["gsm8k doc 17"]))
        assert server.count == 1  # not retried: the server said no
    finally:
        server.close()


def test_transport_errors_are_retried_with_backoff_then_fail_naming_the_request():
    import asyncio
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"gsm8k doc 3: no answer from .* after 3 attempts \(ConnectError"):
        asyncio.run(_engine(f"http://127.0.0.1:{port}", retries=2)._post_all("/v1/completions", [{}], None, ["gsm8k doc 3"]))
    assert time.monotonic() - t0 >= 3.0  # backoff 1 s + 2 s between the attempts


def test_local_tokenizing_is_checked_against_the_server_and_falls_back(monkeypatch):
    engine = _engine("http://unused", retries=0)
    monkeypatch.setattr(engine, "_connect", lambda: None)
    server_calls = []

    def server_encode(texts):
        server_calls.append(list(texts))
        return [[len(t)] for t in texts]

    class Local:
        def __init__(self, agree):
            self.agree = agree

        def encode(self, text, add_special_tokens):
            assert add_special_tokens is False
            return [len(text) if self.agree else -1]

    monkeypatch.setattr(engine, "_server_encode", server_encode)
    engine._local, engine.tokenized_by = Local(agree=True), "local"
    assert engine.encode_many(["ab", "abc"]) == [[2], [3]]
    assert server_calls == [["ab"]]  # only the first text went to the server, as the check
    engine._local = Local(agree=False)
    assert engine.encode_many(["abcd", "x"]) == [[4], [1]]  # the server's ids, for the whole batch
    assert engine._local is None and engine.tokenized_by.startswith("server")
    assert engine.encode_many(["yz"]) == [[2]] and server_calls[-1] == ["yz"]


def test_end_of_sequence_id_comes_from_the_local_tokenizer_or_says_how_to_get_it(monkeypatch):
    engine = _engine("http://unused", retries=0)
    monkeypatch.setattr(engine, "_connect", lambda: None)
    engine._local = type("Tok", (), {"eos_token_id": 7})()
    assert engine.eos_token_id == 7
    engine._local, engine._eos = None, False
    monkeypatch.setattr(engine, "_try_get", lambda path: None)  # a server without /tokenizer_info
    with pytest.raises(ServerError, match="--enable-tokenizer-info-endpoint"):
        _ = engine.eos_token_id


def test_the_journal_answers_what_an_earlier_attempt_already_asked(tmp_path):
    """A worker killed mid-task, started again: the completions it had received come from
    its journal, only the rest go to the server. Tokenizing is always asked again."""
    import asyncio

    from evalpipe.documents.journal import JOURNAL_FILE
    from evalpipe.documents.worker_job import ServerJob
    from evalpipe.worker.journal import RequestJournal

    server = _Counting(200)
    path = tmp_path / JOURNAL_FILE
    bodies = [{"prompt": [1, 2, i]} for i in range(4)]
    labels = [f"doc {i}" for i in range(4)]
    try:
        def engine() -> HttpEngine:
            return HttpEngine(ServerJob(url=server.url, concurrency=2), lazy=True, journal=RequestJournal(path))

        first = engine()
        asyncio.run(first._post_all("/v1/completions", bodies[:3], None, labels[:3]))  # killed after three
        first.journal.close()
        with open(path, "a") as fh:
            fh.write('{"key": "cut sho')  # the line the kill cut short
        assert server.count == 3
        again = engine()
        answers = asyncio.run(again._post_all("/v1/completions", bodies, None, labels))
        assert server.count == 4, "only the request the first attempt never got an answer to is sent"
        assert answers == [{"error": "refused"}] * 4
        assert again.journal.summary().model_dump() == {"file": JOURNAL_FILE, "answers_found": 3, "answers_reused": 3}
        asyncio.run(again._post_all("/tokenize", bodies[:1], None, labels[:1]))
        assert server.count == 5
        again.journal.close()
        assert RequestJournal(path).loaded == 4, "the cut line is skipped and does not spoil the next one"
    finally:
        server.close()
