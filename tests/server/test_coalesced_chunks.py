"""Tokens of one stream that pile up before its next write go out in one chunk (as vLLM
sends them under load): the chunk keeps OpenAI's shape (a delta of several tokens, their
logprobs entries together, offsets that go on from the chunk before), and the official
openai client reads it as it reads any other."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from pagedchat.server.routes import Reply
from pagedchat.server.state import ServerSettings, ServerState
from pagedchat.server.streaming import StreamJob

openai = pytest.importorskip("openai")

HELLO = [{"role": "user", "content": "Say hello."}]
TOKENS = 12


class _NoEngineLoop:
    """The job's outputs are queued by the test; nothing is left to abort."""

    def abort(self, request_id: str) -> None:
        raise AssertionError(f"{request_id} was aborted, but it finished")


@pytest.fixture(scope="module")
def state(tiny_llm) -> ServerState:
    return ServerState(tiny_llm.engine, ServerSettings(model_name="tiny"))


def engine_outputs(state: ServerState, prompt: list[int], logprobs: int) -> list:
    """Every step's output of one greedy request, as the engine thread hands them over."""
    engine = state.engine_loop.engine
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=TOKENS,
                                                   ignore_eos=True, logprobs=logprobs))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert len(outputs) == TOKENS
    return outputs


async def two_chunk_stream(state: ServerState, body, outputs: list) -> str:
    """The SSE body when the first token is written alone and every later one piles up
    before the next write."""
    sink: asyncio.Queue = asyncio.Queue()
    reply = Reply(state, body, "r", 1)
    stream = reply.stream(StreamJob(_NoEngineLoop(), ["r"], sink))
    sink.put_nowait(outputs[0])
    pieces = [await anext(stream)]
    for output in outputs[1:]:
        sink.put_nowait(output)
    pieces += [piece async for piece in stream]
    return "".join(pieces)


def openai_client(sse: str) -> openai.OpenAI:
    """The official client, reading ``sse`` as the reply to whatever it sends."""
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=sse.encode()))
    return openai.OpenAI(base_url="http://pagedchat.test/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport))


async def test_coalesced_chat_chunk(state):
    prompt = await state.chat_prompt([ChatMessage(**message) for message in HELLO])
    outputs = engine_outputs(state, prompt, logprobs=2)
    body = ChatCompletionRequest(messages=HELLO, max_tokens=TOKENS, stream=True,
                                 logprobs=True, top_logprobs=2,
                                 stream_options={"include_usage": True})
    sse = await two_chunk_stream(state, body, outputs)
    chunks = list(openai_client(sse).chat.completions.create(
        model="tiny", messages=HELLO, stream=True))
    first, rest, last = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == outputs[0].outputs[0].delta
    assert len(first.choices[0].logprobs.content) == 1
    piled = rest.choices[0]
    assert piled.delta.role is None and piled.finish_reason == "length"
    assert len(piled.logprobs.content) == TOKENS - 1  # one entry per token, in order
    assert "".join(item.token for item in piled.logprobs.content) == piled.delta.content
    assert all(len(item.top_logprobs) == 2 for item in piled.logprobs.content)
    assert first.choices[0].delta.content + piled.delta.content == outputs[-1].outputs[0].text
    assert last.choices == [] and last.usage.completion_tokens == TOKENS
    assert last.usage.prompt_tokens == len(prompt)


async def test_coalesced_completion_chunk(state):
    prompt = (await state.completion_prompts("Once upon a time"))[0]
    outputs = engine_outputs(state, prompt, logprobs=1)
    body = CompletionRequest(prompt=prompt, max_tokens=TOKENS, stream=True, logprobs=1,
                             stream_options={"include_usage": True})
    sse = await two_chunk_stream(state, body, outputs)
    chunks = list(openai_client(sse).completions.create(
        model="tiny", prompt=prompt, stream=True))
    first, rest, last = chunks
    head, piled = first.choices[0], rest.choices[0]
    assert head.logprobs.tokens == [head.text] and head.logprobs.text_offset == [0]
    assert len(piled.logprobs.tokens) == len(piled.logprobs.token_logprobs) == TOKENS - 1
    assert "".join(piled.logprobs.tokens) == piled.text
    # offsets go on from where the first chunk's text ended
    offsets = piled.logprobs.text_offset
    assert offsets[0] == len(head.text)
    assert [b - a for a, b in zip(offsets, offsets[1:])] == [
        len(token) for token in piled.logprobs.tokens[:-1]]
    assert head.text + piled.text == outputs[-1].outputs[0].text
    assert piled.finish_reason == "length" and last.usage.completion_tokens == TOKENS
