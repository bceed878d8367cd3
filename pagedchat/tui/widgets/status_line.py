"""One line under the chat: the model's state on the left, the engine's load on the right."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static


class StatusLine(Horizontal):
    model_state: reactive[str] = reactive("")
    load: reactive[str] = reactive("")
    _loading: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="model-state", markup=False)
        yield Static(id="engine-load", markup=False)

    def watch_model_state(self, text: str) -> None:
        self.query_one("#model-state", Static).update(text)

    def watch_load(self, text: str) -> None:
        self.query_one("#engine-load", Static).update(text)

    def show_loading(self, model_name: str, started: float) -> None:
        """Count the seconds since ``started`` (``time.monotonic``) until :meth:`show_state`, on
        this widget's timer: it ends with the widget (an app's could fire during teardown)."""
        def tick() -> None:
            self.model_state = (f"◌ loading {model_name}… {time.monotonic() - started:.0f}s "
                                "(you can type already)")

        tick()
        self._loading = self.set_interval(1.0, tick)

    def show_state(self, text: str) -> None:
        """The model's state for good: loaded or failed."""
        if self._loading is not None:
            self._loading.stop()
        self.model_state = text
