"""One streamed completion against any OpenAI-compatible server, timed chunk by chunk.

The client shares the cores with a server under test, so it reads the stream cheaply:
aiohttp's parser, one SSE line at a time, one ``json.loads`` per event."""

from __future__ import annotations

import json
import time

import aiohttp

from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request


async def stream_completion(session: aiohttp.ClientSession, url: str, model: str,
                            request: Request, text: str | None = None,
                            extra: dict | None = None) -> RequestResult:
    """POST ``url`` (a server's /v1/completions) with the prompt's token ids (or ``text``,
    for a server that takes no ids), stream: true, ignore_eos, the trace's output length and
    the ``extra`` fields; errors are recorded, never raised."""
    result = RequestResult(request.prompt_len, 0.0, id=request.id,
                           expected_output_len=request.output_len)
    body = {"model": model, "prompt": request.prompt_ids if text is None else text,
            "max_tokens": request.output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    result.arrival = time.perf_counter()
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
                    result.token_times.append(time.perf_counter())
                if chunk.get("usage"):
                    result.counted_len = chunk["usage"].get("completion_tokens", 0)
    except (aiohttp.ClientError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    return result
