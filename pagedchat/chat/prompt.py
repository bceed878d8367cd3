"""History -> prompt token ids, kept within a context window.

The chatbot workload of the PagedAttention paper keeps the last 1024 tokens of the
history. Cutting tokens blindly would split the chat template's markup, so here whole
messages drop off instead, oldest first: the system prompt always stays, then the
newest messages that fit. Only when the newest message alone is too long is it cut,
keeping its end (the question is usually at the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_CONTEXT_WINDOW = 1024


class Tokenizer(Protocol):
    chat_template: str | None

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


class PromptTooLong(ValueError):
    """Not even the system prompt and a part of the newest message fit the window."""


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    kept_messages: int
    dropped_messages: int
    truncated: bool  # the newest message was cut to its end


def build_prompt(
    tokenizer: Tokenizer,
    system_prompt: str,
    messages: list[dict[str, str]],
    context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> Prompt:
    """Render ``messages`` (oldest first, the newest is answered) within ``context_window``."""
    if not messages:
        raise ValueError("a prompt needs at least one message")
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    kept: list[int] | None = None
    count = 0
    for start in range(len(messages) - 1, -1, -1):
        ids = render(tokenizer, head + messages[start:])
        if len(ids) > context_window:
            break
        kept, count = ids, len(messages) - start
    if kept is not None:
        return Prompt(kept, count, len(messages) - count, truncated=False)
    return Prompt(_cut_newest(tokenizer, head, messages[-1], context_window),
                  1, len(messages) - 1, truncated=True)


def render(tokenizer: Tokenizer, conversation: list[dict[str, str]]) -> list[int]:
    """Token ids of ``conversation`` in the chat template, ready for the assistant's turn."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if not isinstance(ids, list) else ids)
    # A model without a template (a base or test model): plain "role: text" lines.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant:"
    return list(tokenizer.encode(text))


def _cut_newest(
    tokenizer: Tokenizer, head: list[dict[str, str]], newest: dict[str, str], window: int
) -> list[int]:
    overhead = len(render(tokenizer, head + [{**newest, "content": ""}]))
    budget = window - overhead
    content_ids = tokenizer.encode(newest["content"], add_special_tokens=False)
    # Re-tokenizing decoded text can merge or split tokens; shrink until it fits.
    while budget > 0:
        text = tokenizer.decode(content_ids[-budget:])
        ids = render(tokenizer, head + [{**newest, "content": text}])
        if len(ids) <= window:
            return ids
        budget -= len(ids) - window
    raise PromptTooLong(
        f"the system prompt and chat template take {overhead} tokens, "
        f"more than the context window of {window}: shorten the system prompt "
        f"or raise --context-window"
    )
