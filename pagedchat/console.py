"""What the commands print besides their results: notes and progress on stderr (so that a
piped stdout stays parseable), and the metadata that goes with a written result."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@cache
def _console(to_stderr: bool) -> Console:
    from rich.console import Console

    return Console(stderr=to_stderr)


def __getattr__(name: str) -> Console:
    """``stdout`` and ``stderr``, rich consoles made on first use: a command's ``--help``
    and usage errors never print through them, and should not wait for rich to import."""
    if name in ("stdout", "stderr"):
        return _console(name == "stderr")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def note(message: str) -> None:
    """A line for the reader (on stderr, so that piped stdout stays parseable)."""
    _console(True).print(message, highlight=False, soft_wrap=True)


# the progress display open now, shared by the tasks that overlap (a first start compiles
# the kernels on a thread of its own while the model loads); rich allows one at a time
_shown: list = []
_shown_lock = threading.Lock()


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (a spinner where ``total`` is None), one row of one display
    that tasks open at the same time share; yields ``advance(k)``. Silent when stderr is not
    a terminal."""
    from rich import progress as bars

    class Counted(bars.ProgressColumn):
        """``column`` for a task with a total, nothing for a spinner's."""

        def __init__(self, column: bars.ProgressColumn) -> None:
            super().__init__()
            self.column = column

        def render(self, task: bars.Task):
            return self.column.render(task) if task.total is not None else ""

    with _shown_lock:
        if not _shown:
            _shown.append(bars.Progress(
                bars.SpinnerColumn(), bars.TextColumn("{task.description}"),
                Counted(bars.BarColumn()), Counted(bars.MofNCompleteColumn()),
                bars.TimeElapsedColumn(), console=_console(True), transient=True,
                disable=not _console(True).is_terminal))
            _shown[0].start()
        bar = _shown[0]
        task = bar.add_task(description, total=total)
    try:
        yield lambda k=1: bar.advance(task, k)
    finally:
        with _shown_lock:
            bar.remove_task(task)
            if not bar.tasks:
                bar.stop()
                _shown.clear()


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def cpu_description() -> dict[str, object]:
    """The CPU a figure came from: its name, family and model (as Linux reports them), and
    whether it has AVX2 and AVX-512; elsewhere what ``platform`` knows."""
    fields: dict[str, str] = {}
    with suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"name": fields.get("model name") or platform.processor() or platform.machine(),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "avx2": "avx2" in flags, "avx512": "avx512f" in flags}


def run_metadata(engine_config, model_source: str) -> dict[str, object]:
    """What a result needs to be compared with another: model, weights and KV layout,
    versions, machine (the CPU, and the level of the CPU kernels in use)."""
    from pagedchat.kernels.cpu import isa

    return {
        "model": model_source, "dtype": engine_config.dtype, "weights": engine_config.weights,
        "block_size": engine_config.block_size, "num_kv_blocks": engine_config.num_kv_blocks,
        "versions": {"python": platform.python_version(),
                     **{name: _version(name) for name in ("pagedchat", "torch", "transformers")}},
        "git_commit": _git_commit(), "cpu_count": os.cpu_count(), "cpu": cpu_description(),
        "cpu_kernels": isa()}


def engine_metadata(engine) -> dict[str, object]:
    """``run_metadata`` of a built engine."""
    return run_metadata(engine.config, engine.model_files.source)
