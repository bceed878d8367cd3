"""Long one-time work announced while it runs: converting a model, compiling the CPU
kernels. The engine and the kernels open a :func:`task`; a front end that shows it (the
command line) installs a reporter with :func:`reporting`. Without one, nothing is shown,
so that the library stays silent and imports nothing of any front end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

Advance = Callable[[int], None]
# (what is being done, how many steps or None) -> a context that yields advance(k)
Reporter = Callable[[str, int | None], AbstractContextManager[Advance]]
_reporters: list[Reporter] = []


def _ignore(k: int = 1) -> None:
    """Progress nobody shows."""


@contextmanager
def task(description: str, total: int | None = None) -> Iterator[Advance]:
    """Announce ``description`` to the installed reporter while the block runs; yields
    ``advance(k)`` for ``total`` steps (None: one step of unknown length)."""
    if not _reporters:
        yield _ignore
        return
    with _reporters[-1](description, total) as advance:
        yield advance


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Show every :func:`task` opened in the block through ``reporter``."""
    _reporters.append(reporter)
    try:
        yield
    finally:
        _reporters.remove(reporter)
