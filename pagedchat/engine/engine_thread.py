"""The one thread that owns an engine, for the chat driver and the server's engine loop alike.

The engine is single-threaded: callers never call it, they put commands on this thread's
queue. The thread takes every queued command between two steps (waiting for one only while
there is nothing to step), then runs one step; ``STOP`` ends it. A subclass says what a
command does, what a step hands back, and what stopping leaves behind.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedchat.engine.llm_engine import LLMEngine

STOP = object()  # the command that ends the thread


class EngineThread:
    def __init__(self, name: str) -> None:
        self._commands: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to end and wait for it; False if it still runs after ``timeout``
        (a model load, or a step, cannot be interrupted)."""
        self._commands.put(STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        """The thread's body: get the engine ready, then :meth:`_serve` it."""
        raise NotImplementedError

    def _serve(self, engine: LLMEngine) -> None:
        """Commands between steps until STOP."""
        while True:
            for command in self._take(block=not self._can_step(engine)):
                if command is STOP:
                    self._on_stop(engine)
                    return
                self._handle(engine, command)
            if self._can_step(engine):
                self._step(engine)
            self._after_step(engine)

    def _can_step(self, engine: LLMEngine) -> bool:
        return engine.has_unfinished_requests()

    def _handle(self, engine: LLMEngine, command: Any) -> None:
        raise NotImplementedError

    def _step(self, engine: LLMEngine) -> None:
        raise NotImplementedError

    def _after_step(self, engine: LLMEngine) -> None:
        """Called after each round of commands and (where there was one) step."""

    def _on_stop(self, engine: LLMEngine) -> None:
        """Called on STOP, before the thread ends."""

    def _take(self, block: bool) -> list:
        """Every command queued now; with ``block``, the first one is waited for."""
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands
