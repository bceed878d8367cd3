"""Sending a trace to a server: arrivals at a rate with a burstiness, at most
``max_concurrency`` requests in flight."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import httpx

from pagedchat_lab.http_client import stream_completion
from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request


def arrival_offsets(count: int, rate: float, burstiness: float = 1.0, seed: int = 0,
                    ) -> list[float]:
    """Arrival times (s) whose gaps are gamma-distributed with mean 1/rate and shape
    ``burstiness``: 1 is a Poisson process, below 1 burstier, above 1 more regular
    (vLLM's convention). ``rate`` inf sends everything at once."""
    if rate == float("inf"):
        return [0.0] * count
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


async def run_load(base_url: str, model: str, requests: list[Request], offsets: list[float],
                   max_concurrency: int | None = None, api_key: str | None = None,
                   texts: list[str] | None = None, extra: dict | None = None,
                   ) -> tuple[list[RequestResult], float]:
    """Each request sent at its offset (later when ``max_concurrency`` are in flight), as
    its text when ``texts`` are given, with the ``extra`` body fields; returns the results
    in trace order and the wall time from first send to last reply."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url}/v1/completions"
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)  # 0: no limit
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0)
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=timeout) as session:
        start = time.perf_counter()

        async def one(request: Request, offset: float, text: str | None) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            if gate is None:
                return await stream_completion(session, url, model, request, text, extra)
            async with gate:
                return await stream_completion(session, url, model, request, text, extra)

        results = await asyncio.gather(*(one(r, o, t) for r, o, t in zip(
            requests, offsets, texts or [None] * len(requests))))
        return list(results), time.perf_counter() - start


async def served_model(base_url: str, api_key: str | None = None) -> str:
    """The first model the server lists at /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        reply = await client.get("/v1/models")
        reply.raise_for_status()
        return reply.json()["data"][0]["id"]
