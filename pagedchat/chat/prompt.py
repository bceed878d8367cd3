"""History -> prompt token ids, kept within a context window (the paper's chatbot keeps 1024).

Whole messages drop off, oldest first, so the chat template's markup is never split: the
system prompt always stays, then the newest messages that fit. Only a newest message too
long alone is cut, keeping its end (where the question usually is).

A model without a chat template (a base model) gets plain "User: ... / Assistant: ..." lines
and stops where the user's next line would begin; ``raw`` gives no markup at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_CONTEXT_WINDOW = 1024
PLAIN_FORMAT_NOTE = ("this model has no chat template: the chat uses a plain "
                     "\"User: / Assistant:\" format (--raw: plain continuation)")
PLAIN_STOP = "\nUser:"  # where a base model would begin to write the user's next turn


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


def build_prompt(tokenizer: Tokenizer, system_prompt: str, messages: list[dict[str, str]],
                 context_window: int = DEFAULT_CONTEXT_WINDOW, raw: bool = False,
                 continue_last: bool = False) -> Prompt:
    """Render ``messages`` (oldest first, the newest is answered) within ``context_window``;
    ``raw``: their text alone, without the system prompt or any markup; ``continue_last``:
    the newest is a reply cut short, to be continued where it stopped."""
    if not messages:
        raise ValueError("a prompt needs at least one message")
    head = [{"role": "system", "content": system_prompt}] if system_prompt and not raw else []
    kept: list[int] | None = None
    count = 0
    for start in range(len(messages) - 1, -1, -1):
        ids = render(tokenizer, head + messages[start:], raw, continue_last)
        if len(ids) > context_window:
            break
        kept, count = ids, len(messages) - start
    if kept is not None:
        return Prompt(kept, count, len(messages) - count, truncated=False)
    return Prompt(_cut_newest(tokenizer, head, messages[-1], context_window, raw,
                              continue_last), 1, len(messages) - 1, truncated=True)


def has_chat_template(tokenizer: Tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer: Tokenizer, conversation: list[dict[str, str]],
           raw: bool = False, continue_last: bool = False) -> list[int]:
    """Token ids of ``conversation`` in the chat template, ready for the assistant's turn
    (plain "User: / Assistant:" lines without a template; ``raw``: the text alone);
    ``continue_last``: the last message is the assistant's, left open to go on."""
    if raw:
        return list(tokenizer.encode("".join(m["content"] for m in conversation)))
    if has_chat_template(tokenizer):
        ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=not continue_last,
                                            continue_final_message=continue_last, tokenize=True)
        return list(ids["input_ids"] if not isinstance(ids, list) else ids)
    *earlier, last = conversation
    lines = earlier if continue_last else conversation
    text = "".join(f"{m['content']}\n\n" if m["role"] == "system"
                   else f"{m['role'].capitalize()}: {m['content']}\n" for m in lines)
    return list(tokenizer.encode(text + "Assistant:"
                                 + (f" {last['content']}" if continue_last else "")))


def _cut_newest(tokenizer: Tokenizer, head: list[dict[str, str]], newest: dict[str, str],
                window: int, raw: bool = False, continue_last: bool = False) -> list[int]:
    overhead = len(render(tokenizer, head + [{**newest, "content": ""}], raw, continue_last))
    budget = window - overhead
    content_ids = tokenizer.encode(newest["content"], add_special_tokens=False)
    # Re-tokenizing decoded text can merge or split tokens; shrink until it fits.
    while budget > 0:
        text = tokenizer.decode(content_ids[-budget:])
        ids = render(tokenizer, head + [{**newest, "content": text}], raw, continue_last)
        if len(ids) <= window:
            return ids
        budget -= len(ids) - window
    raise PromptTooLong(f"the system prompt and chat template take {overhead} tokens, more "
                        f"than the context window of {window}: shorten the system prompt or "
                        "raise --context-window")
