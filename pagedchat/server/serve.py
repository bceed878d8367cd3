"""Running the app under uvicorn. On SIGTERM (or Ctrl-C) the server stops taking requests
(503, and /health says so), lets running ones finish for ``drain_timeout`` seconds, aborts the
rest (finish_reason "abort"), stops the engine and exits with 0. If the engine fails, it stops
the same way and ``run_server`` raises EngineFailed (a non-zero exit for a supervisor)."""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import PagedChatError
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.server.app import create_app
from pagedchat.server.limits import header_timeout_protocol
from pagedchat.server.state import ServerSettings, ServerState

log = logging.getLogger("pagedchat.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame) -> None:
        state = self.state
        if not state.draining:
            state.draining = True
            bound = state.settings.drain_timeout
            log.info("stopping: no new requests; running ones get %g s to finish", bound)
            asyncio.get_event_loop().call_later(
                bound, state.engine_loop.abort_all,
                "the server is shutting down and the drain time ran out")
        super().handle_exit(sig, frame)


def build_engine(config: EngineConfig) -> LLMEngine:
    """The engine, built on a thread that ends once it is built (its load errors raised
    here): an OpenMP pool lives as long as the thread that made it, and the main thread's,
    idle beside the engine thread's, would make libgomp sleep at every barrier."""
    with ThreadPoolExecutor(1, thread_name_prefix="engine-load") as loader:
        return loader.submit(LLMEngine, config).result()


def uvicorn_config(app, settings: ServerSettings, host: str, port: int,
                   log_level: str = "info") -> uvicorn.Config:
    """How uvicorn runs the app: HTTP/1.1 with a deadline on each request's headers."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          timeout_graceful_shutdown=settings.drain_timeout + 5,
                          access_log=log_level == "debug",
                          http=header_timeout_protocol(settings.read_timeout))


class EngineFailed(PagedChatError):
    """The engine failed as a whole while serving; the server has stopped."""


def run_server(engine: LLMEngine, settings: ServerSettings, host: str, port: int,
               log_level: str = "info") -> None:
    """Serve until SIGTERM or Ctrl-C; returns once everything has stopped. Raises
    EngineFailed when the engine failed and the server stopped because of it."""
    app = create_app(engine, settings)
    config = uvicorn_config(app, settings, host, port, log_level)
    state: ServerState = app.state.server
    server = DrainingServer(config, state)
    loop = state.engine_loop

    def ready() -> None:
        log.info("ready (warm-up %.1f s): serving %s at http://%s:%d", loop.warm_up_seconds or 0,
                 " / ".join(map(repr, settings.model_names)), host, port)

    def failed(reason: str) -> None:
        state.draining = True
        server.should_exit = True

    loop.on_ready, loop.on_failure = ready, failed
    # uvicorn raises the signal it caught again once it has shut down: with these handlers
    # in place beforehand that second delivery is ignored and the process exits with 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if loop.failed is not None:
        raise EngineFailed(f"the engine failed ({loop.failed}); the server stopped")
