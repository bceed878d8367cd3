"""/new [TITLE]: start a new session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedchat.chat.conversation import DEFAULT_TITLE
from pagedchat.tui.commands.registry import command

if TYPE_CHECKING:
    from pagedchat.tui.app import ChatApp


@command("/new [TITLE]", "start a new session", needs_session=False)
async def new(app: ChatApp, argument: str) -> bool:
    await app.action_new_session(argument or DEFAULT_TITLE)
    return True
