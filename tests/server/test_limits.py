"""One client cannot hold up the others: a body over --max-request-bytes is refused
unread, a client that stalls on its headers or its body is cut off, and completions past
--max-concurrent-requests get 429; /health answers throughout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import LiveServer, serving
from tests.server.test_errors import HELLO, error_of

LIMITS = {"max_request_bytes": 64 * 1024, "read_timeout": 1.0, "max_concurrent_requests": 2}


@pytest.fixture(scope="module")
def limited_server(tiny_model_dir) -> Iterator[LiveServer]:
    with serving(tiny_model_dir, settings=LIMITS) as live:
        yield live


def raw_connection(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_to_close(sock: socket.socket) -> str:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data.decode()


def test_a_body_over_the_limit_is_413_before_it_is_read(limited_server):
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * 5_000_000 + b'"}]}'
    start = time.perf_counter()
    reply = httpx.post(f"{limited_server.url}/v1/chat/completions", content=body,
                       headers={"content-type": "application/json"}, timeout=30)
    error = error_of(reply, 413)
    assert error["code"] == "request_too_large" and "65536" in error["message"]
    assert time.perf_counter() - start < 10


def test_a_chunked_body_over_the_limit_is_413(limited_server):
    def chunks():
        for _ in range(100):
            yield b"x" * 4096

    reply = httpx.post(f"{limited_server.url}/v1/completions", content=chunks(),
                       headers={"content-type": "application/json"}, timeout=30)
    assert error_of(reply, 413)["code"] == "request_too_large"


def test_a_body_that_stalls_is_408_and_health_answers_meanwhile(limited_server):
    with raw_connection(limited_server.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        start = time.perf_counter()
        health = httpx.get(f"{limited_server.url}/health", timeout=5)
        assert health.status_code == 200 and time.perf_counter() - start < 0.5
        answer = read_to_close(sock)
    assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer


def test_a_client_that_never_finishes_its_headers_is_cut_off(limited_server):
    with raw_connection(limited_server.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        start = time.perf_counter()
        assert sock.recv(4096) == b""  # closed by the server
    assert time.perf_counter() - start < 5
    with raw_connection(limited_server.url) as sock:  # a connection that sends nothing
        assert sock.recv(4096) == b""


def test_completions_past_the_limit_get_429(limited_server):
    body = {"messages": HELLO, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}
    started = threading.Barrier(3)
    streams: list[int] = []

    def long_stream() -> None:
        with httpx.stream("POST", f"{limited_server.url}/v1/chat/completions", json=body,
                          timeout=60) as reply:
            streams.append(reply.status_code)
            started.wait(10)
            for _ in reply.iter_lines():
                pass

    threads = [threading.Thread(target=long_stream) for _ in range(2)]
    for thread in threads:
        thread.start()
    started.wait(10)
    refused = httpx.post(f"{limited_server.url}/v1/chat/completions",
                         json={"messages": HELLO, "max_tokens": 2}, timeout=30)
    error = error_of(refused, 429)
    assert error["code"] == "rate_limit_exceeded" and refused.headers["retry-after"] == "1"
    assert httpx.get(f"{limited_server.url}/health", timeout=5).status_code == 200
    for thread in threads:
        thread.join(60)
    assert streams == [200, 200]
    after = httpx.post(f"{limited_server.url}/v1/chat/completions",
                       json={"messages": HELLO, "max_tokens": 2}, timeout=30)
    assert after.status_code == 200
