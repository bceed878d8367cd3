"""The one thread that owns an engine, for the chat driver and the server's engine loop alike.

Callers put commands on this thread's queue; it takes every queued command between two steps
(waiting for one only while there is nothing to step), then runs one step; ``STOP`` ends it.
A subclass says what a command does, what a step hands back, and what stopping leaves behind."""

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
        self._backlog: list = []  # commands taken behind one that ended an engine's serving
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to end and wait for it; False if it still runs after ``timeout``
        (a model load, or a step, cannot be interrupted)."""
        self._commands.put(STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        """The thread's body: get the engine ready, then :meth:`_serve` it."""
        raise NotImplementedError

    def _serve(self, engine: LLMEngine) -> object:
        """Commands between steps until STOP or another command that :meth:`_ends` serving
        this engine; returns that command. Commands taken after it wait in the backlog for
        whatever the thread serves next."""
        while True:
            commands = self._take(block=not self._can_step(engine))
            for place, command in enumerate(commands):
                if command is STOP or self._ends(command):
                    self._on_stop(engine, command)
                    self._backlog = commands[place + 1:]
                    return command
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

    def _ends(self, command: Any) -> bool:
        """Whether ``command`` ends serving this engine, as STOP does (a model switch)."""
        return False

    def _on_stop(self, engine: LLMEngine, command: object) -> None:
        """Called when ``command`` (STOP, or one that :meth:`_ends` serving) ends it."""

    def _take(self, block: bool) -> list:
        """The backlog and every command queued now; with ``block``, when there are none,
        the first one is waited for."""
        commands, self._backlog = self._backlog, []
        if block and not commands:
            commands.append(self._commands.get())
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands
