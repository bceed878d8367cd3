"""/clear: forget the session's messages, once the user says yes (a reply being
generated stops)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedchat.chat.store import StoreError
from pagedchat.tui.commands.registry import CommandHost, command
from pagedchat.tui.screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from pagedchat.chat.conversation import Session


@command("/clear", "forget this session's messages (asks first)")
async def clear(app: CommandHost, argument: str) -> bool:
    session = app.session
    count = len(session.messages)
    question = f"Forget the {count} messages of “{session.title}”?"

    async def answered(yes: bool | None) -> None:
        if yes:
            await _clear(app, session)
        app.focus_input()

    app.push_screen(ConfirmScreen(question, yes="Clear"), answered)
    return True


async def _clear(app: CommandHost, session: Session) -> None:
    app.replies.drop(session)
    try:
        app.store.clear_messages(session.id)
    except StoreError as error:
        app.notify(str(error), title="Could not clear", severity="error")
        return
    session.messages.clear()
    await app.view(session.id).remove_children()
    app.show_sessions()
    app.remember_inputs()
