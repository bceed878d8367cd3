"""/set NAME VALUE: change one sampling setting of the session, or show them all."""

from __future__ import annotations

from pagedchat.tui.commands.registry import CommandHost, command


@command("/set NAME VALUE", "set temperature, top_p, top_k, repetition_penalty, max_tokens "
         "or seed (alone: show them)")
async def set_value(app: CommandHost, argument: str) -> bool:
    session = app.session
    name, _, value = argument.partition(" ")
    if not name:
        shown = ", ".join(f"{k} = {v}" for k, v in vars(session.settings).items())
        app.notify(shown, title="Settings")
        return True
    try:
        session.settings = session.settings.with_value(name, value.strip())
    except ValueError as error:
        app.notify(str(error), title="/set", severity="error")
        return False
    app.save(lambda: app.store.save_session(session))
    app.notify(f"{name} = {getattr(session.settings, name)}")
    return True
