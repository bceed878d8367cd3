"""/clear: forget the session's messages (a reply being generated stops)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedchat.chat.store import StoreError
from pagedchat.tui.commands.registry import command

if TYPE_CHECKING:
    from pagedchat.tui.app import ChatApp


@command("/clear", "forget this session's messages")
async def clear(app: ChatApp, argument: str) -> bool:
    session = app.session
    app.replies.drop(session)
    try:
        app.store.clear_messages(session.id)
    except StoreError as error:
        app.notify(str(error), title="Could not clear", severity="error")
        return False
    session.messages.clear()
    await app.view(session.id).remove_children()
    app.show_sessions()
    return True
