"""A chat session: title, system prompt, sampling settings and messages."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

from pagedchat.engine.presets import PRESETS
from pagedchat.engine.sampling_params import SamplingParams

# Long enough, with the template, to fill whole KV blocks that sessions share (prefix cache).
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful, concise assistant running in a terminal. Answer in plain language, "
    "use Markdown for lists and code, and say when you are not sure. Keep answers short "
    "unless the user asks for detail."
)
DEFAULT_TITLE = "New chat"

Role = Literal["user", "assistant"]
# generating: being written; cancelled: the user stopped it; interrupted: the app ended first;
# error: the engine refused it; looped: the repetition guard stopped it (its text is kept);
# unanswered (a user message): no reply to it was saved, the app ended or failed first.
Status = Literal["done", "generating", "cancelled", "interrupted", "error", "unanswered", "looped"]


@dataclass
class SamplingSettings:
    """The sampling knobs a user may change with ``/set NAME VALUE``."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = PRESETS["chat"].max_tokens
    seed: int | None = None
    loop_guard: bool = True  # stop a reply that repeats itself (chat/repetition.py)

    def to_params(self) -> SamplingParams:
        knobs = asdict(self)
        del knobs["loop_guard"]  # the chat's, not the engine's
        return SamplingParams(**knobs)

    def with_value(self, name: str, text: str) -> SamplingSettings:
        """A copy with ``name`` set from ``text``; ValueError names what was wrong."""
        kinds = {f.name: f.type for f in fields(self)}
        if name not in kinds:
            raise ValueError(f"unknown setting {name!r} (settings: {', '.join(kinds)})")
        value: float | int | None
        try:
            if name == "seed" and text.strip().lower() in ("none", "off", ""):
                value = None
            else:  # by the field's type: bool, float, or int (seed: int | None)
                value = {"bool": _switch, "float": float}.get(kinds[name], int)(text)
        except ValueError:
            wanted = "on or off" if kinds[name] == "bool" else "a number"
            raise ValueError(f"{name} wants {wanted}, got {text!r}") from None
        updated = replace(self, **{name: value})
        updated.to_params()  # the engine's own checks (RequestError is a ValueError)
        return updated

    @classmethod
    def from_dict(cls, data: dict) -> SamplingSettings:
        """Settings from stored JSON; keys this version does not know are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class Message:
    role: Role
    content: str
    status: Status = "done"
    id: int | None = None
    created_at: float = field(default_factory=time.time)
    # Figures of the turn an assistant message answers (zero for user messages).
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    dropped_messages: int = 0
    error: str = ""
    parent_id: int | None = None  # the message this one follows (None: the first)
    # (place, count) among the messages of its role that follow the same one: 2 of 3
    # regenerated replies, or an edited message and its original
    branch: tuple[int, int] = (1, 1)
    # speculative decoding's tokens proposed and accepted for this reply (not stored)
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class Session:
    title: str = DEFAULT_TITLE
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    messages: list[Message] = field(default_factory=list)
    id: int | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    def history(self) -> list[dict[str, str]]:
        """The messages a prompt is made of: everything said, without failed or empty replies."""
        return [{"role": message.role, "content": message.content} for message in self.messages
                if message.role == "user" or (message.content and message.status != "error")]


def title_from(text: str, width: int = 32) -> str:
    """A session title made of the first words of ``text``."""
    words = " ".join(text.split())
    return words if len(words) <= width else words[: width - 1].rstrip() + "…"


def _switch(text: str) -> bool:
    words = {"on": True, "true": True, "yes": True, "1": True,
             "off": False, "false": False, "no": False, "0": False}
    try:
        return words[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None
