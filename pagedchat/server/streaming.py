"""An HTTP request's engine requests: submitted, read until they end, aborted on hang-up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.server.engine_loop import Aborted, Accepted, EngineLoop, Refused
from pagedchat.server.errors import APIError

T = TypeVar("T")


@dataclass
class StreamJob:
    """The engine requests of one HTTP request (one per prompt), read through one queue."""

    loop: EngineLoop
    request_ids: list[str]
    sink: asyncio.Queue
    early: list = field(default_factory=list)  # outputs that came before every Accepted
    unfinished: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.unfinished = set(self.request_ids)

    def close(self) -> None:
        """Abort the requests that have not ended (the client is gone)."""
        for rid in self.unfinished:
            self.loop.abort(rid)
        self.unfinished = set()

    async def events(self) -> AsyncIterator[list[RequestOutput | Aborted]]:
        """Batches of events as they come (all queued at once) until every request ended;
        stopping aborts the rest."""
        unfinished = self.unfinished
        batch, self.early = self.early, []
        try:
            while unfinished:
                if not batch:
                    batch = [await self.sink.get()]
                while not self.sink.empty():
                    batch.append(self.sink.get_nowait())
                for event in batch:
                    if isinstance(event, Aborted) or event.finished:
                        unfinished.discard(event.request_id)
                yield batch
                batch = []
        finally:
            self.close()


async def start_job(loop: EngineLoop, base_id: str, prompts: list[list[int]],
                    params: SamplingParams, arrival_time: float) -> StreamJob:
    """Submit every prompt and wait until the engine took them all (or refused one:
    then the others are aborted and the refusal is raised as a 400)."""
    sink: asyncio.Queue = asyncio.Queue()
    ids = [base_id] if len(prompts) == 1 else [f"{base_id}-{i}" for i in range(len(prompts))]
    job = StreamJob(loop, ids, sink)
    for rid, prompt in zip(ids, prompts, strict=True):
        loop.add(rid, prompt, params, arrival_time, sink)
    pending, refusal = set(ids), None
    try:
        while pending:
            event = await sink.get()
            if isinstance(event, Accepted | Refused):
                pending.discard(event.request_id)
                if isinstance(event, Refused) and refusal is None:
                    refusal = event
            else:
                job.early.append(event)
    except BaseException:  # cancelled: the client left while the engine was taking them
        job.close()
        raise
    if refusal is not None:
        job.close()
        raise APIError(refusal.status, refusal.message, refusal.param)
    return job


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | Response:
    """``work``'s result, or an empty response once the client hung up (``work`` cancelled,
    aborting its engine requests)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, APIError):
        await task
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class EventStream(StreamingResponse):
    """Server-sent events that stop, and abort their requests, when the client hangs up:
    the body is cancelled as soon as the disconnect arrives, whichever ASGI version the
    server speaks (Starlette waits for a failed write under ASGI 2.4)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], cleanup: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            async def stream() -> None:
                with contextlib.suppress(OSError):  # the socket went first
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()
        # a body stopped at a yield (the write was cancelled) still runs its cleanup now,
        # and one that never started has its requests aborted all the same
        await self.body_iterator.aclose()
        self.cleanup()
