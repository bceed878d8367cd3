"""Slash commands typed in the input box: the table (help is made from it) and the parser."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str
    help: str


COMMANDS = [
    SlashCommand("new", "/new [TITLE]", "start a new session"),
    SlashCommand("system", "/system [TEXT]", "set the system prompt (alone: show it)"),
    SlashCommand("set", "/set NAME VALUE",
                 "set temperature, top_p, top_k, repetition_penalty, max_tokens or seed "
                 "(alone: show them)"),
    SlashCommand("clear", "/clear", "forget this session's messages"),
    SlashCommand("rename", "/rename [TITLE]", "rename this session"),
    SlashCommand("export", "/export [PATH.md]", "write this session as Markdown and JSON"),
    SlashCommand("help", "/help", "show keys and commands"),
]


def parse(text: str) -> tuple[str, str] | None:
    """``"/set top_k 5"`` -> ``("set", "top_k 5")``; None when ``text`` is not a command."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, argument = text[1:].partition(" ")
    return name.lower(), argument.strip()
