"""Many streams at once, clients that hang up, and a shared system prompt: every request
ends (finished or aborted) and the KV pool balances to zero used blocks."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

SYSTEM = ("You are a careful assistant. Answer in one short sentence, plainly, and never "
          "invent facts you were not given. ") * 3


def chat_body(index: int, max_tokens: int, stream: bool = True) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Question number {index}?"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


async def full_stream(http: httpx.AsyncClient, index: int) -> tuple[str | None, bool]:
    """The last finish_reason seen and whether [DONE] came."""
    reason, done = None, False
    async with http.stream("POST", "/v1/chat/completions", json=chat_body(index, 24)) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                for choice in json.loads(line[6:])["choices"]:
                    reason = choice["finish_reason"] or reason
    return reason, done


async def hang_up(http: httpx.AsyncClient, index: int) -> int:
    """Read two chunks of a long stream, then close the connection."""
    seen = 0
    async with http.stream("POST", "/v1/chat/completions", json=chat_body(index, 850)) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == 2:
                    break
    return seen


async def give_up(url: str, index: int) -> None:
    """A non-streamed request whose client stops waiting for the answer: only the read is
    timed out, so that under load the request still reaches the server before it does."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, read=0.5)) as http:
        with pytest.raises(httpx.TimeoutException):
            await http.post("/v1/chat/completions", json=chat_body(index, 850, stream=False))


def sample_value(live_server, name: str, labels: dict | None = None) -> float:
    return live_server.state.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def settled_stats(live_server):
    """The engine's stats once nothing runs or waits (bounded: 100 tries)."""
    for _ in range(100):
        stats = await live_server.state.engine_loop.stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError("requests still running after the clients finished")


async def test_64_streams_and_clients_that_hang_up(live_server):
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=live_server.url, timeout=120, limits=limits) as http:
        results = await asyncio.gather(
            *(full_stream(http, i) for i in range(64)),
            *(hang_up(http, 100 + i) for i in range(8)),
            *(give_up(live_server.url, 200 + i) for i in range(4)))
    streams, hung = results[:64], results[64:72]
    assert streams == [("length", True)] * 64
    assert hung == [2] * 8
    stats = await settled_stats(live_server)
    assert stats.used_blocks == 0
    assert stats.free_blocks + stats.cached_blocks == stats.total_blocks
    for _ in range(600):  # the last handlers may still be counting their aborts (bounded)
        aborted = sample_value(live_server, "pagedchat_requests_total", {"finish_reason": "abort"})
        if aborted >= 12:
            break
        await asyncio.sleep(0.05)
    assert sample_value(live_server, "pagedchat_requests_total",
                        {"finish_reason": "length"}) == 64
    assert aborted == 12
    # the requests after the first step's found the system prompt's blocks in the cache
    assert stats.prefix_hits >= 48 * 64


async def test_same_system_prompt_hits_the_prefix_cache_in_metrics(live_server):
    async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as http:
        def hits(text: str) -> float:
            line = next(x for x in text.splitlines()
                        if x.startswith("pagedchat_prefix_cache_hits_total "))
            return float(line.split()[1])

        before = hits((await http.get("/metrics")).text)
        reply = await http.post("/v1/chat/completions", json=chat_body(1, 2, stream=False))
        cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        after = hits((await http.get("/metrics")).text)
    assert cached >= 48 and after - before == cached
