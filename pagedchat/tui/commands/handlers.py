"""The slash commands, in the order /help lists them: each declared beside its handler."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from pagedchat.chat.conversation import DEFAULT_TITLE, Session
from pagedchat.engine.loading import named_models
from pagedchat.tui.commands.registry import CommandHost, command
from pagedchat.tui.screens.confirm import ConfirmScreen


@command("/new [TITLE]", "start a new session", needs_session=False)
async def new(app: CommandHost, argument: str) -> bool:
    await app.action_new_session(argument or DEFAULT_TITLE)
    return True


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


# /model: the sessions stay as they are (the next reply is the new model's)
DEFAULT = "default"  # the name /model takes for the default model


def model_list(current: str) -> str:
    """One line per model /model takes by name: installed or not, the one in use marked."""
    rows = [(DEFAULT, named_models.DEFAULT_MODEL_NAME, True)]
    rows += [(m.name, f"{m.title}, {m.quantization}, {m.size / 2**20:,.0f} MiB",
              named_models.is_installed(m)) for m in named_models.NAMED_MODELS.values()]
    lines = [f"{'●' if current in (name, title) else ' '} {name}: {title}"
             f"{'' if installed else ' (not installed)'}" for name, title, installed in rows]
    return "\n".join([*lines, "/model NAME switches; /model PATH takes an HF folder or "
                              "a GGUF file"])


@command("/model [NAME|PATH]", "switch the model (alone: list the models)", needs_session=False)
async def model(app: CommandHost, argument: str) -> bool:
    if not argument:
        app.notify(model_list(app.model_name), title=f"Model: {app.model_name}", timeout=15)
        return True
    if app.load_model is None:
        app.notify("This app was started without a way to load other models", severity="error")
        return False
    if app.replies.turns:
        app.notify("Replies are being written: wait, or press Esc to stop them, then "
                   "switch", severity="warning")
        return False
    if argument.lower() in (DEFAULT, named_models.DEFAULT_MODEL_NAME.lower()):
        spec, name = None, named_models.DEFAULT_MODEL_NAME
    elif argument in named_models.NAMED_MODELS:
        named = named_models.NAMED_MODELS[argument]
        if not named_models.is_installed(named):
            missing = tuple(p for p in named.parts if named_models.part_path(p) is None)
            app.notify(f"{argument} is not installed; install it with "
                       f"'{named.install_command(missing)}' and restart, or /model "
                       f"another one", title="Not installed", severity="error", timeout=15)
            return False
        spec, name = argument, argument
    elif (path := Path(argument).expanduser()).exists():
        spec, name = str(path), path.name
    else:
        app.notify(f"There is no model named {argument!r} and no such file or folder; "
                   "/model lists the names", severity="error")
        return False
    if name == app.model_name and app.replies.engine_ready:
        app.notify(f"{name} is the model already")
        return True
    app.switch_model(spec, name)
    return True


# /regen and /edit make a new branch beside the old one (Alt+←/→ goes between them)
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


@command("/rename [TITLE]", "rename this session")
async def rename(app: CommandHost, argument: str) -> bool:
    if argument:
        app.rename(argument)
    else:
        app.action_rename_session()
    return True


_MARKS = {"cancelled": " (cancelled)", "interrupted": " (interrupted)", "error": " (failed)",
          "unanswered": " (no reply)", "looped": " (stopped: repeating itself)"}


def to_markdown(session: Session) -> str:
    lines = [f"# {session.title}", ""]
    if session.system_prompt:
        lines += ["> **System:** " + session.system_prompt.replace("\n", "\n> "), ""]
    for message in session.messages:
        who = "You" if message.role == "user" else "Assistant"
        lines += [f"## {who}{_MARKS.get(message.status, '')}", "", message.content, ""]
        if message.error:
            lines += [f"*{message.error}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(session: Session) -> str:
    return json.dumps(asdict(session), indent=2, ensure_ascii=False) + "\n"


@command("/export [PATH.md]", "write this session as Markdown and JSON")
async def export(app: CommandHost, argument: str) -> bool:
    session = app.session
    default = app.store.path.parent / "exports" / f"session-{session.id}.md"
    markdown_path = Path(argument).expanduser() if argument else default
    json_path = markdown_path.with_suffix(".json")  # beside it, the same name
    try:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(to_markdown(session), encoding="utf-8")
        json_path.write_text(to_json(session), encoding="utf-8")
    except OSError as error:
        app.notify(str(error), title="Could not export", severity="error")
        return False
    app.notify(f"{markdown_path}\n{json_path}", title="Exported")
    return True


@command("/help", "show keys and commands")
async def show_help(app: CommandHost, argument: str) -> bool:
    app.action_help()
    return True
