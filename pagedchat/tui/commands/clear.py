"""/clear: forget the session's messages, once the user says yes (a reply being generated stops)."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command
from pagedchat.tui.screens.confirm import ConfirmScreen


@command("/clear", "forget this session's messages (asks first)")
async def clear(app: CommandHost, argument: str) -> bool:
    session = app.session
    question = f"Forget the {len(session.messages)} messages of “{session.title}”?"

    async def answered(yes: bool | None) -> None:
        if yes:
            app.replies.drop(session)
            if app.save(lambda: app.store.clear_messages(session.id), "Could not clear"):
                session.messages.clear()
                await app.view(session.id).remove_children()
                app.show_sessions()
                app.remember_inputs()
        app.focus_input()

    app.push_screen(ConfirmScreen(question, yes="Clear"), answered)
    return True
