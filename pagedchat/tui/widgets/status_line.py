"""One line under the chat: the model's state on the left, the engine's load on the right."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Static


class StatusLine(Horizontal):
    model_state: reactive[str] = reactive("")
    load: reactive[str] = reactive("")

    def compose(self) -> ComposeResult:
        yield Static(id="model-state", markup=False)
        yield Static(id="engine-load", markup=False)

    def watch_model_state(self, text: str) -> None:
        self.query_one("#model-state", Static).update(text)

    def watch_load(self, text: str) -> None:
        self.query_one("#engine-load", Static).update(text)
