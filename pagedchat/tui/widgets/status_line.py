"""One line under the chat: the model's state on the left, the engine's load on the right.
Beside the state, the one-time jobs a first start waits for (compiling the kernels,
converting a model) with their steps, as :mod:`pagedchat.progress` reports them."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static

from pagedchat import progress


class StatusLine(Horizontal):
    model_state: reactive[str] = reactive("")
    load: reactive[str] = reactive("")
    _loading: Timer | None = None

    class TaskShown(Message):
        """A job's progress, or its end (``text`` None), posted from the thread doing it."""

        def __init__(self, key: int, text: str | None) -> None:
            super().__init__()
            self.key, self.text = key, text

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self._state, self._tasks = "", {}  # the model's state; the jobs running, by key
        self._keys, self._reporting = itertools.count(), ExitStack()

    def compose(self) -> ComposeResult:
        yield Static(id="model-state", markup=False)
        yield Static(id="engine-load", markup=False)

    def on_mount(self) -> None:
        self._reporting.enter_context(progress.reporting(self._report))

    def on_unmount(self) -> None:
        self._reporting.close()

    def watch_model_state(self, text: str) -> None:
        self.query_one("#model-state", Static).update(text)

    def watch_load(self, text: str) -> None:
        self.query_one("#engine-load", Static).update(text)

    def show_loading(self, model_name: str, started: float) -> None:
        """Count the seconds since ``started`` (``time.monotonic``) until :meth:`show_state`, on
        this widget's timer: it ends with the widget (an app's could fire during teardown)."""
        def tick() -> None:
            self._show(f"◌ loading {model_name}… {time.monotonic() - started:.0f}s "
                       "(you can type already)")

        tick()
        self._loading = self.set_interval(1.0, tick)

    def show_state(self, text: str) -> None:
        """The model's state for good: loaded or failed."""
        if self._loading is not None:
            self._loading.stop()
        self._show(text)

    def _show(self, state: str | None = None) -> None:
        self._state = self._state if state is None else state
        self.model_state = " · ".join([self._state, *self._tasks.values()])

    @contextmanager
    def _report(self, description: str, total: int | None) -> Iterator[progress.Advance]:
        key, done = next(self._keys), 0

        def advance(steps: int = 1) -> None:
            nonlocal done
            done += steps
            counted = f" ({done}/{total})" if total else ""
            self.post_message(self.TaskShown(key, description + counted))

        advance(0)
        try:
            yield advance
        finally:
            self.post_message(self.TaskShown(key, None))

    def on_status_line_task_shown(self, event: TaskShown) -> None:
        event.stop()
        if event.text is None:
            self._tasks.pop(event.key, None)
        else:
            self._tasks[event.key] = event.text
        self._show()
