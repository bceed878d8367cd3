"""Live engine figures, each with a sparkline of its recent history."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Label, Sparkline

from pagedchat.engine.outputs import EngineStats

HISTORY = 60  # snapshots kept per figure

# name, label, how it is shown
FIGURES: list[tuple[str, str, str]] = [
    ("kv_used", "KV used", "{:.0%}"),
    ("utilization", "utilization", "{:.0%}"),
    ("fragmentation", "fragmentation", "{:.1%}"),
    ("hit_rate", "prefix hits", "{:.0%}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("tokens_per_second", "tokens/s", "{:.1f}"),
]


def figures_of(stats: EngineStats, tokens_per_second: float) -> dict[str, float]:
    return {
        "kv_used": stats.used_blocks / stats.total_blocks if stats.total_blocks else 0.0,
        "utilization": stats.utilization,
        "fragmentation": stats.internal_fragmentation,
        "hit_rate": stats.prefix_hit_rate,
        "preemptions": float(stats.preemptions),
        "tokens_per_second": tokens_per_second,
    }


class Figures(Grid):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._history = {name: deque(maxlen=HISTORY) for name, _, _ in FIGURES}

    def compose(self) -> ComposeResult:
        for name, label, _ in FIGURES:
            yield Label(label, classes="figure-name")
            yield Label("-", id=f"value-{name}", classes="figure-value")
            yield Sparkline([], id=f"spark-{name}")

    def add(self, values: dict[str, float]) -> None:
        """Add one snapshot's values and show them."""
        for name, _, shape in FIGURES:
            history = self._history[name]
            history.append(values[name])
            self.query_one(f"#value-{name}", Label).update(shape.format(values[name]))
            self.query_one(f"#spark-{name}", Sparkline).data = list(history)
