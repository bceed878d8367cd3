"""Keys and slash commands, made from the app's own tables so they never drift."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from pagedchat.tui.commands import COMMANDS

ABOUT = """\
## About

pagedchat serves the model with a paged KV cache (PagedAttention). Several sessions
can answer at once: the engine batches them into the same steps. Sessions with the
same system prompt share its KV blocks, and a session's next turn reuses the blocks of
its last one while they stay cached; the inspector (F3) shows both.
"""


def key_name(key: str) -> str:
    """``"ctrl+pageup,ctrl+k"`` -> ``"Ctrl+Pageup"``."""
    return "+".join(part.capitalize() for part in key.split(",")[0].split("+"))


def cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: a ``|`` in it (``/model [NAME|PATH]``)
    would end the cell."""
    return text.replace("|", "\\|")


def help_markdown(bindings: list[Binding]) -> str:
    keys = [(key_name(b.key), b.tooltip or b.description) for b in bindings if b.description]
    keys += [("Enter / Ctrl+J", "send / new line in the input (Shift+Enter too, where the "
                                 "terminal sends it)"),
             ("Up / Down", "earlier inputs of this session (on the input's first / last line)"),
             ("Y / C", "copy the focused message / its last code block"),
             ("E", "edit the focused message of yours and send it again as a new branch"),
             ("Ctrl+P", "command palette")]
    key_rows = "\n".join(f"| `{cell(key)}` | {cell(does)} |" for key, does in keys)
    command_rows = "\n".join(f"| `{cell(c.usage)}` | {cell(c.help)} |"
                             for c in COMMANDS.values())
    return (f"## Keys\n\n| Key | Does |\n|---|---|\n{key_rows}\n\n"
            f"## Commands\n\n| Command | Does |\n|---|---|\n{command_rows}\n\n{ABOUT}")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog") as dialog:
            dialog.border_title = "pagedchat help"
            dialog.border_subtitle = "Esc closes"
            yield Markdown(help_markdown(self.bindings))
