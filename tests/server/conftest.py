"""A live server on the tiny random Llama, on a free loopback port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class LiveServer:
    url: str
    app: object
    server: object

    @property
    def state(self):
        return self.app.state.server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def unused_port() -> int:
    return free_port()


def wait_until_healthy(proc, url: str, timeout: float) -> None:
    """Wait for the server process ``proc`` at ``url`` to answer /health with 200; fail the
    test (and kill it) if it exits or takes longer than ``timeout`` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the server did not become ready")
        time.sleep(0.2)


def start_server(model_dir: Path, api_key: str | None = None, settings: dict | None = None,
                 ready: bool = True, **engine) -> tuple:
    """A server as ``pagedchat serve`` runs it (the same uvicorn set-up), listening, and
    with ``ready`` warmed up too; ``settings``: ServerSettings fields."""
    import uvicorn

    from pagedchat.engine.config import EngineConfig
    from pagedchat.engine.llm_engine import LLMEngine
    from pagedchat.server.app import create_app
    from pagedchat.server.serve import uvicorn_config
    from pagedchat.server.state import ServerSettings

    config = {"num_kv_blocks": 256, "block_size": 16, "swap_space": "0B", **engine}
    llm = LLMEngine(EngineConfig(model=str(model_dir), **config))
    server_settings = ServerSettings(**{"model_name": "tiny", "api_key": api_key,
                                        **(settings or {})})
    app = create_app(llm, server_settings)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, server_settings, "127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and (app.state.server.engine_loop.ready.is_set() or not ready)):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return LiveServer(f"http://127.0.0.1:{port}", app, server), thread


@contextmanager
def serving(model_dir: Path, **options) -> Iterator[LiveServer]:
    """start_server's server (same options) while the block runs, stopped after it."""
    live, thread = start_server(model_dir, **options)
    try:
        yield live
    finally:
        live.server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def live_server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with serving(tiny_model_dir) as live:
        yield live


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with serving(tiny_model_dir, api_key="sesame", num_kv_blocks=8) as live:
        yield live
