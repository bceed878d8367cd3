"""`bench isolation`: do running streams keep their pace, and does /health answer, while
clients send bodies far over the server's limit?

``pagedchat serve`` runs as a child process. Two phases on the same server: ``streams``
chat streams alone, then the same streams while ``floods`` clients each send a ``body_mb``
MB body every ``interval`` seconds (0: back to back, a flood) until the streams end. In
both, /health is polled every ``health_interval`` seconds. The figures: the worst and
median gap between two chunks of a stream, /health's worst and median latency, and for
the big bodies, the status and time of each refusal.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import httpx

from pagedchat_lab.servers import ServerProcess, pagedchat_command
from pagedchat_lab.suite import EngineOptions

QUESTION = "Write a long story about a lighthouse keeper and a storm."


@dataclass
class Phase:
    chunk_gaps_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    refusals: list[tuple[int, float]] = field(default_factory=list)  # (status, ms)

    def figures(self) -> dict[str, object]:
        statuses = sorted({status for status, _ in self.refusals})
        return {
            "worst_chunk_gap_ms": max(self.chunk_gaps_ms, default=float("nan")),
            "median_chunk_gap_ms": _median(self.chunk_gaps_ms),
            "worst_health_ms": max(self.health_ms, default=float("nan")),
            "median_health_ms": _median(self.health_ms),
            "health_failures": self.health_failures,
            "big_requests": len(self.refusals),
            "big_request_statuses": ",".join(map(str, statuses)) or "-",
            "worst_refusal_ms": max((ms for _, ms in self.refusals), default=float("nan")),
        }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def _stream(http: httpx.AsyncClient, max_tokens: int, phase: Phase) -> None:
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    last = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if last is not None:
                phase.chunk_gaps_ms.append((now - last) * 1000)
            last = now


async def _poll_health(http: httpx.AsyncClient, interval: float, phase: Phase,
                       done: asyncio.Event) -> None:
    while not done.is_set():
        start = time.perf_counter()
        try:
            reply = await http.get("/health")
            phase.health_ms.append((time.perf_counter() - start) * 1000)
            phase.health_failures += reply.status_code != 200
        except httpx.TransportError:
            phase.health_failures += 1
        await asyncio.sleep(interval)


async def _flood(url: str, body: bytes, interval: float, phase: Phase,
                 done: asyncio.Event) -> None:
    """Big bodies on fresh connections, one every ``interval`` seconds."""
    while not done.is_set():
        start = time.perf_counter()
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            try:
                reply = await http.post("/v1/chat/completions", content=body,
                                        headers={"content-type": "application/json"})
                status = reply.status_code
            except httpx.TransportError:  # closed while still sending: refused all the same
                status = 0
        phase.refusals.append((status, (time.perf_counter() - start) * 1000))
        await asyncio.sleep(interval)


async def _phase(url: str, streams: int, max_tokens: int, floods: int, body: bytes,
                 interval: float, health_interval: float) -> Phase:
    phase = Phase()
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        watchers = [asyncio.create_task(_poll_health(http, health_interval, phase, done))]
        watchers += [asyncio.create_task(_flood(url, body, interval, phase, done))
                     for _ in range(floods)]
        try:
            await asyncio.gather(*(_stream(http, max_tokens, phase) for _ in range(streams)))
        finally:
            done.set()
            await asyncio.gather(*watchers)
    return phase


def big_body(megabytes: float) -> bytes:
    """A chat request whose one message makes the body ``megabytes`` MB."""
    size = int(megabytes * 1e6)
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}]}'
    return head + b"word " * ((size - len(head) - len(tail)) // 5) + tail


def isolation(options: EngineOptions, streams: int, max_tokens: int, floods: int,
              body_mb: float, interval: float, health_interval: float,
              ) -> dict[str, dict[str, object]]:
    """The two phases' figures, ``alone`` and ``flooded``."""
    body = big_body(body_mb)
    with ServerProcess("pagedchat serve", partial(pagedchat_command, options),
                       ready_path="/health") as server:
        run = partial(_phase, server.url, streams, max_tokens, interval=interval,
                      health_interval=health_interval)
        alone = asyncio.run(run(0, body))
        flooded = asyncio.run(run(floods, body))
    return {"alone": alone.figures(), "flooded": flooded.figures()}
