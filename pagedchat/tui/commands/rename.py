"""/rename [TITLE]: rename the session (alone: ask for the title)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedchat.tui.commands.registry import command

if TYPE_CHECKING:
    from pagedchat.tui.app import ChatApp


@command("/rename [TITLE]", "rename this session")
async def rename(app: ChatApp, argument: str) -> bool:
    if argument:
        app.rename(argument)
    else:
        app.action_rename_session()
    return True
