"""/system [TEXT]: set the session's system prompt, or show it."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command


@command("/system [TEXT]", "set the system prompt (alone: show it)")
async def system(app: CommandHost, argument: str) -> bool:
    session = app.session
    if not argument:
        app.notify(session.system_prompt or "(none)", title="System prompt")
        return True
    session.system_prompt = argument
    app.save(lambda: app.store.save_session(session))
    app.notify("System prompt set for the next replies")
    return True
