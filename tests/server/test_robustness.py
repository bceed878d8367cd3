"""No request takes the server down: values the engine cannot hold are 400s naming their
field, a request that fails inside a step ends alone, a broken engine stops the server
instead of leaving it refusing everything, and /health says ok only once it can answer."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import serving, start_server
from tests.server.test_errors import HELLO, error_of, post


def healthy_after(url: str) -> None:
    """The server still answers: /health is ok and a short chat completes."""
    with httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/health").json() == {"status": "ok"}
        reply = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


# the three requests that once left every later request answered 503, and smaller holes
@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": 4, "min_tokens": 1, "stop_token_ids": [1000000000]}, "stop_token_ids"),
    ({"max_tokens": 4, "top_k": 9223372036854775808, "temperature": 1}, "top_k"),
    ({"max_tokens": 16, "temperature": 0, "ignore_eos": True, "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": ["yes", "no"]}}}},
     "ignore_eos"),
    ({"seed": 18446744073709551616}, "seed"),
    ({"max_tokens": 10**9}, "max_tokens"),
])
def test_values_the_engine_cannot_hold_are_400_naming_the_field(live_server, extra, param):
    error = error_of(post(live_server.url, "/v1/chat/completions",
                          {"messages": HELLO, **extra}), 400)
    assert error["param"] == param and param in error["message"]
    healthy_after(live_server.url)


@pytest.mark.parametrize("raw, param", [
    ('{"messages": [{"role": "user", "content": "Hi"}], "repetition_penalty": Infinity}',
     "repetition_penalty"),
    ('{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', "temperature"),
    ('{"messages": [{"role": "wizard", "content": "Hi"}]}', "messages.0.role"),
])
def test_non_finite_numbers_and_unknown_roles_are_400(live_server, raw, param):
    error = error_of(post(live_server.url, "/v1/chat/completions", raw), 400)
    assert error["param"] == param
    healthy_after(live_server.url)


def test_a_grammar_that_fails_inside_a_step_fails_its_request_alone(live_server, monkeypatch):
    from pagedchat.server import structured

    def broken(self, history, row):
        raise RuntimeError("the matcher has terminated")

    monkeypatch.setattr(structured.GrammarProcessor, "__call__", broken)
    body = {"messages": HELLO, "max_tokens": 8, "response_format": {"type": "json_object"}}

    async def both() -> tuple:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as http:
            plain = http.post("/v1/chat/completions", json={
                "messages": HELLO, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            failing = http.post("/v1/chat/completions", json=body)
            streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
            return await asyncio.gather(plain, failing, streamed)

    plain, failing, streamed = asyncio.run(both())
    assert plain.status_code == 200 and plain.json()["choices"][0]["finish_reason"] == "length"
    assert "matcher has terminated" in error_of(failing, 500)["message"]
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert any("matcher has terminated" in e.get("error", {}).get("message", "") for e in events)
    assert streamed.text.rstrip().endswith("data: [DONE]")
    monkeypatch.undo()
    healthy_after(live_server.url)
    stats = asyncio.run(live_server.state.engine_loop.stats())
    assert stats.used_blocks == 0


@pytest.fixture
def own_server(tiny_model_dir):
    """A server of the test's own, whose engine it may break, and an event set when the
    engine loop reports its failure."""
    with serving(tiny_model_dir) as live:
        stopped = threading.Event()
        live.state.engine_loop.on_failure = lambda reason: stopped.set()
        yield live, stopped


def test_a_failed_engine_is_reported_and_stops_the_server(own_server):
    live, stopped = own_server

    def broken(step):
        raise RuntimeError("a kernel fault")

    live.state.engine_loop.engine.runner.execute = broken
    error = error_of(post(live.url, "/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
                     503)
    assert "a kernel fault" in error["message"]
    assert stopped.wait(10)
    health = httpx.get(f"{live.url}/health", timeout=10)
    assert health.status_code == 503 and "a kernel fault" in health.json()["reason"]
    assert post(live.url, "/v1/completions", {"prompt": "Hi"}).status_code == 503


def test_health_is_503_with_a_reason_until_the_warm_up_has_run(tiny_model_dir, monkeypatch):
    from pagedchat.server.engine_loop import EngineLoop

    release = threading.Event()
    warm_up = EngineLoop._warm_up

    def held(self):
        release.wait(30)
        return warm_up(self)

    monkeypatch.setattr(EngineLoop, "_warm_up", held)
    live, thread = start_server(tiny_model_dir, ready=False)
    try:
        health = httpx.get(f"{live.url}/health", timeout=10)
        assert health.status_code == 503
        assert health.json()["status"] == "starting" and "warming up" in health.json()["reason"]
        release.set()
        assert live.state.engine_loop.ready.wait(30)
        healthy_after(live.url)
        assert live.state.engine_loop.warm_up_seconds is not None
    finally:
        release.set()
        live.server.should_exit = True
        thread.join(30)


def test_names_with_and_without_the_quantization_suffix_and_aliases():
    from pagedchat.server.state import ServerSettings

    settings = ServerSettings(model_name="SmolLM2-135M-Instruct.Q4_1", aliases=("smol",))
    assert settings.model_names == ["SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct",
                                    "smol"]
    assert ServerSettings(model_name="gemma-3-270m-Q4_K_M").model_names == [
        "gemma-3-270m-Q4_K_M", "gemma-3-270m"]
    assert ServerSettings(model_name="tiny").model_names == ["tiny"]


def test_a_client_may_name_the_model_by_any_of_its_names(tiny_model_dir):
    live, thread = start_server(tiny_model_dir, settings={
        "model_name": "SmolLM2-135M-Instruct.Q4_1", "aliases": ("smol",)})
    try:
        for name in ("SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct", "smol"):
            reply = post(live.url, "/v1/chat/completions",
                         {"model": name, "messages": HELLO, "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "SmolLM2-135M-Instruct.Q4_1"
        error = error_of(post(live.url, "/v1/chat/completions",
                              {"model": "SmolLM2", "messages": HELLO}), 404)
        assert "SmolLM2-135M-Instruct" in error["message"]
        listed = httpx.get(f"{live.url}/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in listed] == ["SmolLM2-135M-Instruct.Q4_1",
                                             "SmolLM2-135M-Instruct", "smol"]
    finally:
        live.server.should_exit = True
        thread.join(30)


def test_an_engine_that_fails_to_abort_is_reported_too(own_server):
    live, stopped = own_server

    def broken(request_id):
        raise RuntimeError("the pool is corrupt")

    live.state.engine_loop.engine.abort_request = broken
    body = {"prompt": "Hi", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=30) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                break  # hang up: the server aborts the request, which fails
    assert stopped.wait(10)
    health = httpx.get(f"{live.url}/health", timeout=10)
    assert health.status_code == 503 and "the pool is corrupt" in health.json()["reason"]


def test_a_model_that_cannot_answer_the_warm_up_stops_the_server_saying_why(tiny_model_dir,
                                                                             tmp_path):
    """Weights that compute NaN (a corrupt file) fail the warm-up's requests: the server
    reports the engine failed, with the cause, rather than look healthy and fail every
    request."""
    import shutil

    from safetensors.torch import load_file, save_file

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, corrupt)
    weights = load_file(corrupt / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(weights, corrupt / "model.safetensors", metadata={"format": "pt"})
    live, thread = start_server(corrupt, ready=False)
    try:
        loop = live.state.engine_loop
        for _ in range(600):  # the warm-up runs on the engine's thread
            if loop.failed is not None:
                break
            time.sleep(0.1)
        assert loop.failed is not None and "computed NaN or infinity" in loop.failed
        assert not loop.ready.is_set()
        health = httpx.get(f"{live.url}/health", timeout=10)
        assert health.status_code == 503 and "computed NaN" in health.json()["reason"]
    finally:
        live.server.should_exit = True
        thread.join(30)
