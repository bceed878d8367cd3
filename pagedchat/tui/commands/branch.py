"""/regen and /edit: another reply to the last message, or an edit of the last message
you sent, each a new branch beside the old one (Alt+←/→ goes between them); /continue:
the last reply goes on where it stopped."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command


@command("/regen", "write another reply to the last message (Ctrl+R; the old one is kept)")
async def regen(app: CommandHost, argument: str) -> bool:
    return await app.replies.regenerate(app.session)


@command("/edit", "edit your last message and send it again as a new branch (e on any "
                  "message of yours)")
async def edit(app: CommandHost, argument: str) -> bool:
    mine = [m for m in app.session.messages if m.role == "user"]
    if not mine:
        app.notify("There is no message of yours to edit", severity="warning")
        return False
    app.edit(mine[-1])
    return False  # the input now holds the message being edited


@command("/continue", "go on with the last reply where it stopped (cut short, cancelled, "
                      "interrupted)")
async def continue_(app: CommandHost, argument: str) -> bool:
    return await app.replies.continue_reply(app.session)
