"""One line under the chat: the model's state on the left, the engine's load on the right;
while a model loads, the one-time jobs it waits for, as :mod:`pagedchat.progress` has them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static

from pagedchat import progress


class StatusLine(Horizontal):
    model_state: reactive[str] = reactive("")
    load: reactive[str] = reactive("")
    _loading: Timer | None = None

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self._jobs: dict[object, str] = {}  # written by the working threads, read each tick
        self._reporting = progress.reporting(self._report)

    def on_mount(self) -> None:
        self._reporting.__enter__()

    def on_unmount(self) -> None:
        self._reporting.__exit__(None, None, None)

    @contextmanager
    def _report(self, description: str, total: int | None) -> Iterator[progress.Advance]:
        job, done = object(), [0]

        def advance(steps: int = 1) -> None:
            done[0] += steps
            self._jobs[job] = description + (f" ({done[0]}/{total})" if total else "")

        advance(0)
        try:
            yield advance
        finally:
            del self._jobs[job]

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
        def tick() -> None:  # the jobs: compiling the kernels, converting a model, their steps
            seconds = time.monotonic() - started
            self.model_state = " · ".join([f"◌ loading {model_name}… {seconds:.0f}s (you can type "
                                           "already)", *tuple(self._jobs.values())])

        tick()
        self._loading = self.set_interval(1.0, tick)

    def show_state(self, text: str) -> None:
        """The model's state for good: loaded or failed."""
        if self._loading is not None:
            self._loading.stop()
        self.model_state = text
