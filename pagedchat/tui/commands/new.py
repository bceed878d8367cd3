"""/new [TITLE]: start a new session."""

from __future__ import annotations

from pagedchat.chat.conversation import DEFAULT_TITLE
from pagedchat.tui.commands.registry import CommandHost, command


@command("/new [TITLE]", "start a new session", needs_session=False)
async def new(app: CommandHost, argument: str) -> bool:
    await app.action_new_session(argument or DEFAULT_TITLE)
    return True
