"""Slash commands typed in the input box: each is declared beside its handler, and /help
lists them from the one table this fills. A handler sees the app as a ``CommandHost``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pagedchat.tui.replies import ReplyHost

if TYPE_CHECKING:
    from textual.screen import Screen

    from pagedchat.chat.conversation import Message, Session
    from pagedchat.engine.llm_engine import LLMEngine
    from pagedchat.tui.replies import Replies


class CommandHost(ReplyHost, Protocol):
    """What a slash command asks of the chat app (so that no command imports the app)."""

    replies: Replies
    load_model: Callable[[str | None], LLMEngine] | None

    @property
    def session(self) -> Session | None: ...
    def push_screen(self, screen: Screen, callback: Callable[[Any], Any] | None = None) -> Any: ...
    def focus_input(self) -> None: ...
    def remember_inputs(self) -> None: ...
    def switch_model(self, spec: str | None, name: str) -> None: ...
    def edit(self, message: Message) -> None: ...
    def rename(self, title: str | None) -> None: ...
    def action_help(self) -> None: ...
    async def action_new_session(self, title: str = ...) -> None: ...
    def action_rename_session(self) -> None: ...


Handler = Callable[[CommandHost, str], Awaitable[bool]]


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str
    help: str
    run: Handler  # True when it ran (the input is cleared), False when it did not
    needs_session: bool = True


COMMANDS: dict[str, SlashCommand] = {}  # in the order /help lists them


def command(usage: str, help: str, needs_session: bool = True) -> Callable[[Handler], Handler]:
    """Register the decorated handler as the command ``usage`` names (``"/new [TITLE]"``)."""
    def register(run: Handler) -> Handler:
        name = usage.split()[0].removeprefix("/")
        COMMANDS[name] = SlashCommand(name, usage, help, run, needs_session)
        return run
    return register


def parse(text: str) -> tuple[str, str] | None:
    """``"/set top_k 5"`` -> ``("set", "top_k 5")``; None when ``text`` is not a command."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, argument = text[1:].partition(" ")
    return name.lower(), argument.strip()


async def run_slash(app: CommandHost, name: str, argument: str) -> bool:
    """Run ``/name argument``; False (the text stays in the input) when it did not run."""
    if (found := COMMANDS.get(name)) is None:
        app.notify(f"Unknown command /{name}: /help lists them", severity="error")
        return False
    if found.needs_session and app.session is None:
        app.notify("No session is open", severity="error")
        return False
    return await found.run(app, argument)
