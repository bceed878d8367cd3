"""/model [NAME|PATH]: list the models the app can switch to, or switch to one; the
sessions stay as they are (the next reply is the new model's)."""

from __future__ import annotations

from pathlib import Path

from pagedchat.engine.loading.loader import DEFAULT_MODEL_NAME
from pagedchat.engine.loading.named_models import NAMED_MODELS, is_installed, part_path
from pagedchat.tui.commands.registry import CommandHost, command

DEFAULT = "default"  # the name /model takes for the default model


def model_list(current: str) -> str:
    """One line per model /model takes by name: installed or not, the one in use marked."""
    rows = [(DEFAULT, DEFAULT_MODEL_NAME, True)]
    rows += [(m.name, f"{m.title}, {m.quantization}, {m.size / 2**20:,.0f} MiB",
              is_installed(m)) for m in NAMED_MODELS.values()]
    lines = [f"{'●' if current in (name, title) else ' '} {name}: {title}"
             f"{'' if installed else ' (not installed)'}" for name, title, installed in rows]
    return "\n".join([*lines, "/model NAME switches; /model PATH takes an HF folder or "
                              "a GGUF file"])


@command("/model [NAME|PATH]", "switch the model (alone: list the models)",
         needs_session=False)
async def model(app: CommandHost, argument: str) -> bool:
    if not argument:
        app.notify(model_list(app.model_name), title=f"Model: {app.model_name}", timeout=15)
        return True
    if app.load_model is None:
        app.notify("This app was started without a way to load other models",
                   severity="error")
        return False
    if app.replies.turns:
        app.notify("Replies are being written: wait, or press Esc to stop them, then "
                   "switch", severity="warning")
        return False
    if argument.lower() in (DEFAULT, DEFAULT_MODEL_NAME.lower()):
        spec, name = None, DEFAULT_MODEL_NAME
    elif argument in NAMED_MODELS:
        named = NAMED_MODELS[argument]
        if not is_installed(named):
            missing = tuple(p for p in named.parts if part_path(p) is None)
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
