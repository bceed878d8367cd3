"""/rename [TITLE]: rename the session (alone: ask for the title)."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command


@command("/rename [TITLE]", "rename this session")
async def rename(app: CommandHost, argument: str) -> bool:
    if argument:
        app.rename(argument)
    else:
        app.action_rename_session()
    return True
