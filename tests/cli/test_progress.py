"""Progress on a terminal: tasks that overlap (a first start compiles the kernels on a thread
while the model loads) share one display, a row each; a row leaves when its task ends."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from pagedchat import console


def test_overlapping_tasks_share_one_display(monkeypatch):
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    monkeypatch.setattr(console, "_console", lambda to_stderr: terminal)
    inner_open, inner_done = threading.Event(), threading.Event()

    def compile_kernels() -> None:
        with console.progress("compiling", 3) as advance:
            inner_open.set()
            advance(3)
        inner_done.set()

    with console.progress("loading the model", None):
        worker = threading.Thread(target=compile_kernels)
        worker.start()
        assert inner_open.wait(10) and inner_done.wait(10)
        worker.join()
    assert console._shown == []  # the display closed with its last task
    shown = screen.getvalue()
    assert "loading the model" in shown and "compiling" in shown and "0/3" in shown
