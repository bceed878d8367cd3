"""Where a step's time goes: cumulative wall time per phase, cheap enough to stay on."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class StepTimer:
    """Adds up seconds per named phase (``schedule``, ``prepare``, ``forward``...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()
        self.steps = 0

    def shares(self) -> dict[str, float]:
        """Each phase's fraction of the total time recorded."""
        total = sum(self.seconds.values())
        return {name: value / total for name, value in self.seconds.items()} if total else {}
