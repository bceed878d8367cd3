"""/help: the keys and these commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedchat.tui.commands.registry import command

if TYPE_CHECKING:
    from pagedchat.tui.app import ChatApp


@command("/help", "show keys and commands")
async def show_help(app: ChatApp, argument: str) -> bool:
    app.action_help()
    return True
