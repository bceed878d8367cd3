"""The one thread that owns the LLMEngine while the server runs: handlers queue commands and
read events from an asyncio queue of their own, each step's outputs sent in one call. It first
warms the engine up (kernels compile at first use; requests wait, ``ready`` unset till then).
A request failing inside a step ends alone (its output carries ``error``); a whole step failing
aborts every request, sets ``failed`` and calls ``on_failure``, so the server can exit for its
supervisor to restart it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedchat.engine.engine_thread import EngineThread
from pagedchat.engine.errors import RequestError
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedchat.engine.llm_engine import LLMEngine
    from pagedchat.engine.outputs import EngineStats

log = logging.getLogger("pagedchat.server")


@dataclass(frozen=True)
class Accepted:
    request_id: str


@dataclass(frozen=True)
class Refused:
    request_id: str
    message: str
    param: str | None = None  # the request's field at fault, where one is
    status: int = 400  # 500 when the fault was the server's


@dataclass(frozen=True)
class Aborted:
    """The server ended the request (shutdown or an engine failure), not its client."""

    request_id: str
    reason: str


Event = Accepted | Refused | Aborted | RequestOutput


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    sink: asyncio.Queue


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _AbortAll:
    reason: str


@dataclass(frozen=True)
class _Stats:
    future: asyncio.Future


WARM_UP_PROMPT = "Hello!"


class EngineLoop(EngineThread):
    def __init__(self, engine: LLMEngine) -> None:
        super().__init__("engine-loop")
        self.engine = engine
        self._live: dict[str, asyncio.Queue] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # set once the warm-up has run
        self.warm_up_seconds: float | None = None
        self.failed: str | None = None  # why the engine stopped, if it did
        self.on_ready: Callable[[], None] = lambda: None  # called on the engine thread
        self.on_failure: Callable[[str], None] = lambda reason: None  # likewise

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failed is None

    @property
    def not_ready_reason(self) -> str | None:
        """Why requests cannot be answered now, or None when they can."""
        if self.failed is not None:
            return f"the engine failed: {self.failed}"
        if not self._thread.is_alive():
            return "the engine is not running"
        if not self.ready.is_set():
            return "warming up: compiling the kernels and running a first step"
        return None

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            arrival_time: float, sink: asyncio.Queue) -> None:
        """Queue a request; ``sink`` gets Accepted or Refused, then its outputs."""
        self._commands.put(_Add(request_id, prompt_token_ids, params, arrival_time, sink))

    def abort(self, request_id: str) -> None:
        """The client is gone: drop the request and free its blocks (nothing is sent)."""
        self._commands.put(_Abort(request_id))

    def abort_all(self, reason: str) -> None:
        """End every running request now; each gets Aborted."""
        self._commands.put(_AbortAll(reason))

    async def stats(self) -> EngineStats:
        """A snapshot taken by the engine thread between two steps (any event loop may ask)."""
        future = asyncio.get_running_loop().create_future()
        self._commands.put(_Stats(future))
        return await future

    def _run(self) -> None:
        if self._warm_up():
            self.ready.set()
            self.on_ready()
        self._serve(self.engine)

    def _can_step(self, engine: LLMEngine) -> bool:
        return self.failed is None and engine.has_unfinished_requests()

    def _on_stop(self, engine: LLMEngine, command: object) -> None:
        self._abort_all("the server is shutting down")

    def _warm_up(self) -> bool:
        """One greedy and one sampled request of a few tokens, to their end: every kernel a
        request meets is compiled and has run once (one that fails fails the engine, as a
        corrupt model's would). Leaves the pool as it found it."""
        engine, start = self.engine, time.perf_counter()
        prompt = engine.tokenizer.encode(WARM_UP_PROMPT)[: engine.config.max_model_len - 3]
        try:
            for rid, temperature in (("warm-up-greedy", 0.0), ("warm-up-sampled", 1.0)):
                with contextlib.suppress(RequestError):  # a pool too small for it: skipped
                    engine.add_request(rid, prompt or [0], SamplingParams(
                        temperature=temperature, max_tokens=2, ignore_eos=True, seed=0))
            while engine.has_unfinished_requests():
                if failed := [out.error for out in engine.step() if out.error is not None]:
                    raise RuntimeError(failed[0])  # a model that cannot answer it serves none
            engine.reset_prefix_cache()
        except Exception as error:
            self._engine_failed(error)
            return False
        self.warm_up_seconds = time.perf_counter() - start
        return True

    def _engine_failed(self, error: Exception) -> None:
        self.failed = f"{type(error).__name__}: {error}"
        log.error("the engine failed: %s", self.failed, exc_info=error)
        self._abort_all(f"the engine failed: {self.failed}")
        self.on_failure(self.failed)

    def _handle(self, engine: LLMEngine, command) -> None:
        try:
            self._take_command(command)
        except Exception as error:  # the thread must live to answer every request
            self._engine_failed(error)

    def _take_command(self, command) -> None:
        if isinstance(command, _Add):
            rid = command.request_id
            if self.failed is not None:
                self._send([(command.sink, Refused(rid, f"the engine failed: {self.failed}"))])
                return
            try:
                self.engine.add_request(rid, command.prompt_token_ids, command.params,
                                        command.arrival_time)
            except RequestError as error:
                self._send([(command.sink, Refused(rid, str(error), error.param))])
                return
            except Exception as error:  # a fault of ours in taking it: this request's alone
                log.error("request %s could not be added", rid, exc_info=error)
                self._send([(command.sink, Refused(rid, f"{type(error).__name__}: {error}",
                                                   status=500))])
                return
            self._live[rid] = command.sink
            self._send([(command.sink, Accepted(rid))])
        elif isinstance(command, _Abort):
            if self._live.pop(command.request_id, None) is not None:
                self.engine.abort_request(command.request_id)
        elif isinstance(command, _AbortAll):
            self._abort_all(command.reason)
        elif isinstance(command, _Stats):
            stats, future = self.engine.stats(), command.future
            with contextlib.suppress(RuntimeError):  # the asking loop is already closed
                future.get_loop().call_soon_threadsafe(
                    lambda: future.done() or future.set_result(stats))

    def _abort_all(self, reason: str) -> None:
        events = []
        for rid, sink in list(self._live.items()):
            with contextlib.suppress(Exception):  # a broken engine still lets go of its clients
                self.engine.abort_request(rid)
            events.append((sink, Aborted(rid, reason)))
        self._live.clear()
        self._send(events)

    def _step(self, engine: LLMEngine) -> None:
        try:
            outputs = engine.step()
        except Exception as error:  # a request's own faults end it inside the step
            self._engine_failed(error)
            return
        events = []
        for output in outputs:
            if (sink := self._live.get(output.request_id)) is None:
                continue
            events.append((sink, output))
            if output.finished:
                del self._live[output.request_id]
        self._send(events)

    def _send(self, events: list[tuple[asyncio.Queue, Event]]) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is already closed
            if events:
                self._loop.call_soon_threadsafe(
                    lambda: [sink.put_nowait(event) for sink, event in events])
