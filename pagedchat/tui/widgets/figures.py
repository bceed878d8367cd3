"""Live engine figures, each with a sparkline of its recent history."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Label, Sparkline

from pagedchat.engine.outputs import EngineStats

HISTORY = 60  # snapshots kept per figure

# name, label, how it is shown, its value in a snapshot (the stats, tokens/s)
FIGURES: list[tuple[str, str, str, Callable[[EngineStats, float], float]]] = [
    ("kv_used", "KV used", "{:.0%}", lambda s, _: s.used_blocks / max(s.total_blocks, 1)),
    ("utilization", "utilization", "{:.0%}", lambda s, _: s.utilization),
    ("fragmentation", "fragmentation", "{:.1%}", lambda s, _: s.internal_fragmentation),
    ("hit_rate", "prefix hits", "{:.0%}", lambda s, _: s.prefix_hit_rate),
    ("preemptions", "preemptions", "{:.0f}", lambda s, _: float(s.preemptions)),
    ("tokens_per_second", "tokens/s", "{:.1f}", lambda _, rate: rate),
]


class Figures(Grid):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._history = {name: deque(maxlen=HISTORY) for name, *_ in FIGURES}

    def compose(self) -> ComposeResult:
        for name, label, *_ in FIGURES:
            yield Label(label, classes="figure-name")
            yield Label("-", id=f"value-{name}", classes="figure-value")
            yield Sparkline([], id=f"spark-{name}")

    def add(self, stats: EngineStats, tokens_per_second: float) -> None:
        """Add one snapshot's values and show them."""
        for name, _, shape, value_of in FIGURES:
            value = value_of(stats, tokens_per_second)
            history = self._history[name]
            history.append(value)
            self.query_one(f"#value-{name}", Label).update(shape.format(value))
            self.query_one(f"#spark-{name}", Sparkline).data = list(history)
