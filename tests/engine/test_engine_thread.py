"""EngineThread: the one thread that owns an engine takes every queued command between two
steps, waits for one only while there is nothing to step, and ends on STOP."""

from __future__ import annotations

import threading

from pagedchat.engine.engine_thread import STOP, EngineThread


class CountingEngine:
    """Steps until ``work`` runs out; records the order of commands and steps."""

    def __init__(self) -> None:
        self.work = 0
        self.log: list[str] = []

    def has_unfinished_requests(self) -> bool:
        return self.work > 0


class Recorder(EngineThread):
    def __init__(self, engine: CountingEngine) -> None:
        super().__init__("test-engine-thread")
        self.engine = engine
        self.stopped = threading.Event()
        self.idle = threading.Event()

    def _run(self) -> None:
        self.ended = [self._serve(self.engine)]
        if self.ended[0] == "switch":  # a second engine serves what was queued behind it
            self.ended.append(self._serve(self.engine))

    def _handle(self, engine, command) -> None:
        engine.log.append(command)
        engine.work += 2

    def _step(self, engine) -> None:
        engine.log.append("step")
        engine.work -= 1

    def _after_step(self, engine) -> None:
        if not engine.has_unfinished_requests():
            self.idle.set()

    def _ends(self, command) -> bool:
        return command == "switch"

    def _on_stop(self, engine, command) -> None:
        engine.log.append(f"ended by {'STOP' if command is STOP else command}")
        self.stopped.set()


def test_commands_between_steps_then_stop():
    engine = CountingEngine()
    thread = Recorder(engine)
    for name in ("a", "b"):  # queued before the thread starts: both taken at once
        thread._commands.put(name)
    thread._thread.start()
    assert thread.idle.wait(10)
    thread.idle.clear()
    thread._commands.put("c")  # the thread waits for it: nothing to step
    assert thread.idle.wait(10)
    assert thread.stop()
    assert thread.stopped.is_set() and not thread._thread.is_alive()
    assert engine.log == ["a", "b"] + ["step"] * 4 + ["c"] + ["step"] * 2 + ["ended by STOP"]


def test_a_command_that_ends_serving_leaves_the_rest_for_the_next():
    engine = CountingEngine()
    thread = Recorder(engine)
    for name in ("a", "switch", "b"):  # taken together: "b" waits behind the switch
        thread._commands.put(name)
    thread._thread.start()
    assert thread.idle.wait(10)
    assert thread.stop()
    assert thread.ended == ["switch", STOP]
    assert engine.log == ["a", "ended by switch", "b"] + ["step"] * 4 + ["ended by STOP"]
