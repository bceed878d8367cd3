"""One streamed completion against any OpenAI-compatible server, timed chunk by chunk.

The client shares the cores with a server under test, so it reads the stream cheaply:
aiohttp's parser, one SSE line at a time, one ``json.loads`` per event."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import aiohttp

from pagedchat.bench.sharegpt import Request


@dataclass
class ServedRequest:
    """What a server did for one request; times in seconds on the client's clock."""

    id: str
    prompt_len: int
    expected_output_len: int
    sent: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # when each text chunk came
    output_len: int = 0  # the server's count (usage), else one token per chunk
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1] - self.sent

    @property
    def tpot(self) -> float | None:
        if self.output_len < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_len - 1)

    @property
    def itls(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:])]

    def record(self) -> dict:
        out = asdict(self)
        out.update(ttft_s=self.ttft if self.ok else None, e2e_s=self.e2e if self.ok else None,
                   tpot_s=self.tpot if self.ok else None)
        return out


async def stream_completion(session: aiohttp.ClientSession, url: str, model: str,
                            request: Request, text: str | None = None,
                            extra: dict | None = None) -> ServedRequest:
    """POST ``url`` (a server's /v1/completions) with the prompt's token ids (or ``text``,
    for a server that takes no ids), stream: true, ignore_eos, the trace's output length and
    the ``extra`` fields; errors are recorded, never raised."""
    result = ServedRequest(request.id, request.prompt_len, request.output_len)
    body = {"model": model, "prompt": request.prompt_ids if text is None else text,
            "max_tokens": request.output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    result.sent = time.perf_counter()
    try:
        async with session.post(url, json=body) as reply:
            if reply.status != 200:
                result.error = f"HTTP {reply.status}: {(await reply.read())[:200]!r}"
                return result
            async for line in reply.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                chunk = json.loads(data)
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    result.chunk_times.append(time.perf_counter())
                if chunk.get("usage"):
                    result.output_len = chunk["usage"].get("completion_tokens", 0)
    except (aiohttp.ClientError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.output_len = result.output_len or len(result.chunk_times)
    return result
