"""POST /v1/chat/completions and /v1/completions, plain and streamed."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pagedchat.engine.outputs import RequestOutput
from pagedchat.server.engine_loop import Aborted
from pagedchat.server.errors import APIError
from pagedchat.server.formatting import chat_logprobs, completion_logprobs, usage
from pagedchat.server.protocol import ChatCompletionRequest, CompletionRequest
from pagedchat.server.state import ServerState
from pagedchat.server.streaming import EventStream, StreamJob, start_job, unless_disconnected

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    arrival = time.time()
    state: ServerState = request.app.state.server
    state.check_model(body.model)
    if body.tools or body.functions:
        raise APIError(400, "tools and functions are not supported", "tools")
    prompt = await state.chat_prompt(body.messages)
    return await _run(request, state, body, [prompt], f"chatcmpl-{uuid.uuid4().hex}", arrival)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    arrival = time.time()
    state: ServerState = request.app.state.server
    state.check_model(body.model)
    if body.echo or body.suffix:
        raise APIError(400, "echo and suffix are not supported", "echo" if body.echo else "suffix")
    prompts = await state.completion_prompts(body.prompt)
    return await _run(request, state, body, prompts, f"cmpl-{uuid.uuid4().hex}", arrival)


async def _run(request: Request, state: ServerState, body, prompts: list[list[int]],
               request_id: str, arrival: float):
    """Submit, then answer whole or streamed; ``arrival`` (when the handler began) makes the
    latency histograms count the prompt's tokenization."""
    params = await state.sampling_params(body, prompts)
    state.log_request(request_id, prompts, params)
    reply = Reply(state, body, request_id, len(prompts))
    job = await unless_disconnected(
        request, start_job(state.engine_loop, request_id, prompts, params, arrival))
    if not isinstance(job, StreamJob):
        reply.count_abandoned()
        return job

    def cleanup() -> None:
        job.close()
        reply.count_abandoned()

    if body.stream:
        return EventStream(reply.stream(job), cleanup)
    try:
        return await unless_disconnected(request, reply.collect(job))
    finally:
        cleanup()


class Reply:
    """One response, chat or completion, built from a job's events."""

    def __init__(self, state: ServerState, body, request_id: str, num_prompts: int) -> None:
        self.state, self.body, self.id = state, body, request_id
        self.chat = isinstance(body, ChatCompletionRequest)
        self.model = state.settings.model_name
        self.created = int(time.time())
        self.top = (body.top_logprobs or 0) if self.chat else (body.logprobs or 0)
        self.wants_logprobs = body.logprobs if self.chat else body.logprobs is not None
        self.n = body.n
        self.num_prompts = num_prompts
        self.finals: dict[str, RequestOutput] = {}
        self.started: set[int] = set()  # chat choices whose first chunk (the role) went out
        self.ended = 0  # choices finished or aborted
        self.error: str | None = None  # why an engine request of this one failed

    def _choice(self, request_id: str, index: int) -> int:
        """Choices of the i-th prompt come i-th, n to a prompt."""
        prompt = int(request_id.rsplit("-", 1)[1]) if self.num_prompts > 1 else 0
        return prompt * self.n + index

    def _finish(self, event: RequestOutput | Aborted) -> None:
        if isinstance(event, RequestOutput) and event.error is not None:
            self.error = event.error
        if isinstance(event, Aborted):
            self.ended += self.n
            self.state.metrics.aborted(self.n)
        elif event.finished:
            self.ended += self.n
            self.finals[event.request_id] = event
            self.state.metrics.observe(event)

    def count_abandoned(self) -> None:
        """Choices whose client left before they ended were aborted (counted once)."""
        self.state.metrics.aborted(self.n * self.num_prompts - self.ended)
        self.ended = self.n * self.num_prompts

    def _head(self) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    async def collect(self, job: StreamJob) -> JSONResponse:
        aborted: Aborted | None = None
        try:
            async with contextlib.aclosing(job.events()) as events:
                async for batch in events:
                    for event in batch:
                        self._finish(event)
                        if isinstance(event, Aborted):
                            aborted = event
        finally:
            self.count_abandoned()
        if aborted is not None:
            raise APIError(503, f"the request was aborted: {aborted.reason}")
        if self.error is not None:
            raise APIError(500, f"the request failed: {self.error}")
        choices = []
        for rid, output in self.finals.items():
            for out in output.outputs:
                choice = {"index": self._choice(rid, out.index), "logprobs": None,
                          "finish_reason": out.finish_reason}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": out.text}
                else:
                    choice["text"] = out.text
                if self.wants_logprobs:
                    choice["logprobs"] = self._logprobs(out.token_ids, out.logprobs, 0)[0]
                choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        return JSONResponse({**self._head(), "choices": choices,
                             "usage": usage(list(self.finals.values()))})

    async def stream(self, job: StreamJob) -> AsyncIterator[str]:
        head = {**self._head(), "object": "chat.completion.chunk" if self.chat
                else "text_completion"}
        include_usage = bool(self.body.stream_options and self.body.stream_options.include_usage)
        sent: dict[int, int] = {}  # choice -> tokens sent
        offsets: dict[int, int] = {}  # choice -> text offset (completion logprobs)
        try:
            async with contextlib.aclosing(job.events()) as events:
                async for batch in events:
                    if choices := self._chunk_choices(batch, sent, offsets):
                        chunk = {**head, "choices": choices}
                        if include_usage:
                            chunk["usage"] = None
                        yield _sse(chunk)
                    if self.error is not None:  # said once, as OpenAI streams an error
                        yield _sse(APIError(500, f"the request failed: {self.error}").body())
                        self.error = None
        finally:
            self.count_abandoned()
        if include_usage:
            yield _sse({**head, "choices": [], "usage": usage(list(self.finals.values()))})
        yield "data: [DONE]\n\n"

    def _chunk_choices(self, batch: list, sent: dict[int, int], offsets: dict[int, int],
                       ) -> list[dict]:
        """One chunk's choices: per choice, the text of every event in the batch joined."""
        merged: dict[int, dict] = {}
        for event in batch:
            self._finish(event)
            if isinstance(event, Aborted):
                for index in range(self.n):
                    choice = self._choice(event.request_id, index)
                    merged.setdefault(choice, self._empty(choice))["finish_reason"] = "abort"
                continue
            for out in event.outputs:
                choice = self._choice(event.request_id, out.index)
                entry = merged.setdefault(choice, self._empty(choice))
                if self.chat:
                    entry["delta"]["content"] = entry["delta"].get("content", "") + out.delta
                else:
                    entry["text"] += out.delta
                if self.wants_logprobs:
                    self._add_logprobs(entry, choice, out, sent, offsets)
                if out.finish_reason is not None:
                    entry["finish_reason"] = out.finish_reason
        return [merged[c] for c in sorted(merged)]

    def _empty(self, choice: int) -> dict:
        if self.chat:
            first = {} if choice in self.started else {"role": "assistant"}
            self.started.add(choice)
            return {"index": choice, "delta": first, "logprobs": None, "finish_reason": None}
        return {"index": choice, "text": "", "logprobs": None, "finish_reason": None}

    def _add_logprobs(self, entry: dict, choice: int, out, sent: dict[int, int],
                      offsets: dict[int, int]) -> None:
        start = sent.get(choice, 0)
        ids, entries = out.token_ids[start:], out.logprobs[start:]
        sent[choice] = len(out.token_ids)
        new, offsets[choice] = self._logprobs(ids, entries, offsets.get(choice, 0))
        if entry["logprobs"] is None:
            entry["logprobs"] = new
        else:
            for key, values in new.items():
                entry["logprobs"][key] += values

    def _logprobs(self, ids: list[int], entries: list, offset: int) -> tuple[dict, int]:
        """Tokens' logprobs in this response's shape, and (completions) the offset after them."""
        if self.chat:
            return chat_logprobs(ids, entries, self.top, self.state.texts), offset
        return completion_logprobs(ids, entries, self.top, self.state.texts, offset)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
