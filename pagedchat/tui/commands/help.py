"""/help: the keys and these commands."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command


@command("/help", "show keys and commands")
async def show_help(app: CommandHost, argument: str) -> bool:
    app.action_help()
    return True
