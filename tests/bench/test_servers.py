"""A server under test as a child process: ready when it lists its models, stopped with
SIGTERM, killed when it ignores it, and a clear error when it cannot start."""

from __future__ import annotations

import signal
import sys

import httpx
import pytest

from pagedchat_lab.servers import (
    ServerProcess,
    free_port,
    llama_server_command,
    pagedchat_command,
)
from pagedchat_lab.suite import EngineOptions

# a stand-in server: answers /v1/models on the port it is given, optionally deaf to SIGTERM
FAKE = """
import http.server, signal, sys
if "deaf" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "fake"}]}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Models).serve_forever()
"""


def fake(*flags: str):
    return lambda port: [sys.executable, "-c", FAKE, str(port), *flags]


def test_a_server_is_ready_when_it_answers_and_gone_after_the_block():
    with ServerProcess("fake", fake()) as server:
        assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"] == "fake"
        assert server.process.poll() is None
    assert server.process.returncode == -signal.SIGTERM
    with pytest.raises(httpx.TransportError):  # nothing listens any more
        httpx.get(f"{server.url}/v1/models", timeout=2)


def test_a_server_deaf_to_sigterm_is_killed():
    server = ServerProcess("deaf", fake("deaf"), stop_timeout=0.5)
    with server:
        pass
    assert server.process.returncode == -signal.SIGKILL


def test_a_server_that_exits_at_start_is_reported_with_its_output():
    server = ServerProcess("broken", lambda port: [
        sys.executable, "-c", "print('no such model: nope.gguf'); raise SystemExit(3)"])
    with pytest.raises(ValueError, match=r"broken exited with code 3.*no such model"):
        with server:
            pass


def test_a_server_that_never_answers_is_stopped():
    server = ServerProcess("mute", lambda port: [
        sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"],
        start_timeout=0.5)
    with pytest.raises(ValueError, match=r"mute did not answer .*loading"):
        with server:
            pass
    assert server.process.returncode is not None


def test_ports_come_from_the_os():
    assert 0 < free_port() < 65536


def test_pagedchat_serve_gets_the_bench_engine_options():
    options = EngineOptions(model="m.gguf", block_size=32, num_kv_blocks=100, max_num_seqs=8,
                            dtype="bfloat16", weights="gguf")
    command = pagedchat_command(options, 1234)
    assert command[:4] == [sys.executable, "-m", "pagedchat.cli", "serve"]
    pairs = dict(zip(command[4::2], command[5::2]))
    assert pairs == {
        "--host": "127.0.0.1", "--port": "1234", "--block-size": "32", "--max-num-seqs": "8",
        "--max-num-batched-tokens": str(options.max_num_batched_tokens),
        "--dtype": "bfloat16", "--tensor-parallel-size": "1", "--log-level": "warning",
        "--model": "m.gguf", "--kv-blocks": "100", "--weights": "gguf"}
    assert "--kv-memory" not in pagedchat_command(EngineOptions(), 1)


def test_pagedchat_serve_takes_every_flag_the_bench_passes():
    from typer.main import get_command

    from pagedchat.cli import app

    serve = get_command(app).commands["serve"]
    known = {flag for param in serve.params for flag in param.opts}
    options = EngineOptions(model="m", num_kv_blocks=1, kv_cache_memory="1GiB", weights="gguf")
    assert set(pagedchat_command(options, 1)[4::2]) <= known


def test_llama_server_waits_its_turn_and_names_a_missing_module(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "sse_starlette" else real(name))
    with pytest.raises(ValueError, match=r"sse_starlette.*pagedchat\[peers\]"):
        llama_server_command("m.gguf", 2, 2048, 1)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    command = llama_server_command("m.gguf", 2, 2048, 1)
    pairs = dict(zip(command[3::2], command[4::2]))
    assert pairs["--interrupt_requests"] == "false" and pairs["--n_threads"] == "2"
    assert pairs["--n_threads_batch"] == "2" and pairs["--model"] == "m.gguf"
