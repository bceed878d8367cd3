"""Keys and slash commands, made from the app's own tables so they never drift."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from pagedchat.tui.slash import COMMANDS

INTRO = """\
# pagedchat

Chat with a model served by a paged KV cache (PagedAttention). Several sessions can
answer at once: the engine batches them into the same steps. Sessions with the same
system prompt share its KV blocks; the inspector shows them.
"""


def help_markdown(bindings: list[Binding]) -> str:
    keys = "\n".join(
        f"| `{binding.key_display or binding.key}` | {binding.description} |"
        for binding in bindings if binding.description
    )
    commands = "\n".join(f"| `{c.usage}` | {c.help} |" for c in COMMANDS)
    return (f"{INTRO}\n## Keys\n\n| Key | Does |\n|---|---|\n{keys}\n"
            "| `Enter` / `Ctrl+J` | send / new line in the input |\n"
            "| `y` / `c` | copy the focused message / its last code block |\n\n"
            f"## Commands\n\n| Command | Does |\n|---|---|\n{commands}\n")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, bindings: list[Binding]) -> None:
        super().__init__()
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog"):
            yield Markdown(help_markdown(self.bindings))
