"""evalpipe/worker/fakes/server.py, in this process: its routes answer as vLLM's server does
for what evalpipe's HTTP engine asks (token ids in, vLLM's logprob shapes out) with the fake
engine's own tokens, refuse as vLLM refuses, and it will not start without the variable
that asks for the fake. Serve mode's lifecycle on it (start, signals, hangs) is
tests/execution/test_serve.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from evalpipe.worker.engines import GenRequest, ScoreRequest
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV, Behaviour, FakeEngine
from evalpipe.worker.fakes.server import TOKEN_ID_PREFIX, FakeServer, _RequestRefused, flag_args, handler_for, main, read_args

PROMPT = [ord(c) for c in "Q: 2+2?"]


def _server(**args) -> FakeServer:
    return FakeServer({"model": "tiny", **args}, FakeEngine({}, Behaviour()))


def test_a_completion_is_the_fake_engine_s_generation_in_vllm_s_shape():
    server = _server()
    answer = server.completion({"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "logprobs": 2})
    (expected,) = FakeEngine({}, Behaviour()).generate([GenRequest(prompt_token_ids=PROMPT, max_tokens=5)], topk=2)
    (choice,) = answer["choices"]
    assert choice["token_ids"] == expected.token_ids and choice["text"] == expected.text
    assert choice["logprobs"]["tokens"] == [f"{TOKEN_ID_PREFIX}{t}" for t in expected.token_ids]
    assert choice["logprobs"]["token_logprobs"] == expected.logprobs
    first = choice["logprobs"]["top_logprobs"][0]
    assert list(first)[0] == f"{TOKEN_ID_PREFIX}{expected.token_ids[0]}"  # the chosen token first, as vLLM lists it
    assert answer["usage"]["prompt_tokens"] == len(PROMPT)


def test_a_sampled_completion_draws_with_the_request_s_seed_as_the_engine_does():
    from evalpipe.worker.engines import Draw

    server = _server()
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "top_k": 0, "min_p": 0.0}
    drawn = [server.completion({**body, "seed": seed})["choices"][0]["token_ids"] for seed in (7, 7, 8)]
    (offline,) = FakeEngine({}, Behaviour()).generate(
        [GenRequest(prompt_token_ids=PROMPT, max_tokens=12, draw=Draw(0.9, 0.95, 0, 0.0, 7))], topk=1)
    assert drawn[0] == drawn[1] == offline.token_ids and drawn[2] != drawn[0]
    greedy = server.completion({"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "seed": 7})
    assert greedy["choices"][0]["token_ids"] != drawn[0]


def test_prompt_logprobs_rank_each_prompt_token_as_the_engine_scores_it():
    server = _server()
    (choice,) = server.completion({"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1})["choices"]
    positions = choice["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(PROMPT)
    (scored,) = FakeEngine({}, Behaviour()).score([ScoreRequest(token_ids=PROMPT, start=1)], topk=1)
    for token, lp, entry in zip(PROMPT[1:], scored.logprobs, positions[1:]):
        assert entry[str(token)]["logprob"] == lp and entry[str(token)]["rank"] >= 1


def test_what_vllm_refuses_is_refused_with_its_wording():
    server = _server(max_logprobs=3)
    with pytest.raises(_RequestRefused, match="greater than max allowed: 3"):
        server.completion({"prompt": PROMPT, "logprobs": 4})
    with pytest.raises(_RequestRefused, match="does not exist"):
        server.completion({"model": "other", "prompt": PROMPT})
    assert server.detokenize(server.tokenize({"prompt": "héllo"}))["prompt"] == "héllo"


def _get(url: str, key: str | None = None) -> tuple[int, dict | None]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_routes_over_http_ask_for_the_api_key_where_vllm_does():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(_server(api_key="secret")))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert _get(f"{base}/health") == (200, None)  # health needs no key
        assert _get(f"{base}/v1/models")[0] == 401
        status, models = _get(f"{base}/v1/models", key="secret")
        assert status == 200 and models["data"][0]["owned_by"] == "evalpipe-fake-server"
        assert _get(f"{base}/nowhere")[0] == 404
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_it_does_not_start_without_the_variable_or_a_readable_config(tmp_path, monkeypatch, capsys):
    config = tmp_path / "server.yaml"
    config.write_text("model: tiny\nmax-logprobs: 5\nport: 1\n")
    assert read_args(config) == {"model": "tiny", "max_logprobs": 5, "port": 1}
    monkeypatch.delenv(FAKE_ENGINE_ENV, raising=False)
    assert main(["--config", str(config)]) == 2
    assert f"starts only with {FAKE_ENGINE_ENV} set" in capsys.readouterr().err
    monkeypatch.setenv(FAKE_ENGINE_ENV, "1")
    (tmp_path / "bad.yaml").write_text("- not a mapping\n")
    assert main(["--config", str(tmp_path / "bad.yaml")]) == 2
    assert "cannot read its arguments" in capsys.readouterr().err
    # a deployment's node gets vLLM's flags instead of a file
    assert flag_args(["--model", "m", "--headless", "--no-enforce-eager", "--additional-config", '{"a": 1}',
                      "--served-model-name", "x", "y"]) == {
        "model": "m", "headless": True, "enforce_eager": False, "additional_config": {"a": 1}, "served_model_name": ["x", "y"]}
    assert main(["--data-parallel-size", "2"]) == 2
    assert "cannot read its arguments: no --model" in capsys.readouterr().err
