"""What a decode step costs as its query rows grow, as this engine's own steps took.

A row's cost depends on the CPU, the model and the kernels a row count takes (a few rows
share each decoding of a weight; past the few-row products' limit a step costs much more),
so drafts are sized by timed steps, not by a constant. Only a lone decoding sequence's
steps are timed; an untimed row count is estimated from the nearest timed count below it
(else the fewest timed) by the prior (``row_cost``). A count untimed for ``EXPIRY`` steps
goes back to that estimate, so one timed dear in a passing burst of load is tried again."""

from __future__ import annotations

import statistics
from collections import deque

# the prior cost of one more query row, as a share of a one-row decode step's
ROW_COST = 0.3
SAMPLES = 16  # the most recent steps kept per row count
MIN_SAMPLES = 3  # steps of a row count timed before their median replaces the prior
EXPIRY = 64  # timed steps of any count after which a count's own last one is forgotten


class StepCosts:
    def __init__(self, row_cost: float = ROW_COST) -> None:
        self.row_cost = row_cost
        self._seconds: dict[int, deque[float]] = {}
        self._table: dict[int, float] = {}  # rows -> median seconds, of the timed counts
        self._steps = 0  # steps timed so far
        self._last: dict[int, int] = {}  # rows -> the number of its last timed step

    def record(self, rows: int, seconds: float) -> None:
        """One step of a lone decoding sequence with ``rows`` query rows took ``seconds``."""
        self._steps += 1
        for stale in [r for r, last in self._last.items() if self._steps - last > EXPIRY]:
            del self._seconds[stale], self._last[stale]
            self._table.pop(stale, None)
        times = self._seconds.setdefault(rows, deque(maxlen=SAMPLES))
        times.append(seconds)
        self._last[rows] = self._steps
        if len(times) >= MIN_SAMPLES:
            self._table[rows] = statistics.median(times)

    def relative(self, rows: int) -> float:
        """The cost of a step of ``rows`` query rows over that of a one-row step."""
        return self._estimate(rows) / self._estimate(1)

    def _prior(self, rows: int) -> float:
        return 1.0 + self.row_cost * (rows - 1)

    def _estimate(self, rows: int) -> float:
        if rows in self._table:
            return self._table[rows]
        if not self._table:
            return self._prior(rows)
        below = [timed for timed in self._table if timed < rows]
        anchor = max(below) if below else min(self._table)
        return self._table[anchor] * self._prior(rows) / self._prior(anchor)
