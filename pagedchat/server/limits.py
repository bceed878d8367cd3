"""Bounds that keep one client from holding up the others. ``RequestLimits`` reads the whole
body before the app (FastAPI would, to parse it): over ``max_bytes`` is 413 as soon as known
(at once by Content-Length), a stall over ``read_timeout`` between chunks 408, a completion
past ``max_concurrent`` running ones 429. ``header_timeout_protocol`` closes a connection
whose headers do not arrive within that time (uvicorn waits forever)."""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
DRAINED_BODIES = 8


class RequestLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float,
                 max_concurrent: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.read_timeout, self.max_concurrent = read_timeout, max_concurrent
        self.running = 0  # completions inside the app now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            # a body up to DRAINED_BODIES times the limit is read and dropped after the 413,
            # so that its client reads the answer; a larger one's connection is closed
            await _refuse(send, *self._too_large(declared),
                          close=declared > DRAINED_BODIES * self.max_bytes)
            return
        if (body := await self._read_body(receive, send)) is None:
            return
        completion = scope["path"] in COMPLETION_PATHS
        if completion and self.running >= self.max_concurrent:
            await _refuse(send, 429, f"the server is running {self.running} completions, its "
                          "limit (--max-concurrent-requests); retry shortly",
                          "rate_limit_exceeded", {"retry-after": "1"})
            return
        self.running += completion
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.running -= completion

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once the request was answered (or its client left)."""
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout)
            except asyncio.TimeoutError:  # noqa: UP041 (a builtin alias from 3.11 only)
                await _refuse(send, 408, f"the request body did not arrive within "
                              f"{self.read_timeout:g} s", "request_timeout", close=True)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:  # a body of unknown length: its connection is closed
                await _refuse(send, *self._too_large(size, at_least=True), close=True)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, size: int, at_least: bool = False) -> tuple[int, str, str]:
        return (413, f"the request body has {'over ' if at_least else ''}{size} bytes; this "
                f"server takes at most {self.max_bytes} (--max-request-bytes)", "request_too_large")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then the client's own messages (its disconnect ends a stream)."""
    first: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return first.pop() if first else await receive()

    return replayed


async def _refuse(send: Send, status: int, message: str, code: str,
                  headers: dict[str, str] | None = None, close: bool = False) -> None:
    """An error in OpenAI's shape, sent before the app saw the request. Unless ``close``,
    the connection stays open: uvicorn then reads and drops the rest of a refused body, so
    that the client, still sending, reads the answer instead of a reset."""
    kind = {429: "rate_limit_error"}.get(status, "invalid_request_error")
    payload = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                    "code": code}}).encode()
    raw_headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]
    if close:
        raw_headers.append((b"connection", b"close"))
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, closing a connection whose next headers are not all in
    ``seconds`` after it opened or last answered (uvicorn's keep-alive stops at the first byte)."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._awaiting_headers():
                self._arm()
            super().data_received(data)
            if not self._awaiting_headers():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
