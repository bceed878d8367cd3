"""The thread that owns an engine, for the chat driver and the server's engine loop alike.

The engine is single-threaded: callers never call it, they put commands on this thread's
queue, and the thread takes every queued command between two steps (waiting for one only
while the engine has nothing to do).
"""

from __future__ import annotations

import queue
import threading

STOP = object()  # the command that ends the thread


class CommandThread:
    def __init__(self, name: str) -> None:
        self._commands: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to end and wait for it; False if it still runs after ``timeout``
        (a model load, or a step, cannot be interrupted)."""
        self._commands.put(STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _take(self, block: bool) -> list:
        """Every command queued now; with ``block``, the first one is waited for."""
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands
