"""The whole KV pool, one cell per physical block, coloured by owner, shared, cached or free."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

OWNER_COLOURS = ["#4ea8de", "#80ed99", "#f4a261", "#c77dff", "#ff6b6b", "#48cae4"]
SHARED, CACHED, FREE, UNKNOWN = "#ffd166", "#7d8597", "#4a4e5a", "#ffffff"
CELL = "■"
_MARKS = {"shared": (CELL, SHARED), "cached": (CELL, CACHED), "free": ("·", FREE)}


def owner_colour(session_id: int) -> str:
    return OWNER_COLOURS[session_id % len(OWNER_COLOURS)]


class PoolMap(Static):
    def show(self, pool: list[str], owners: dict[int, list[str]],
             session_of: dict[str, int], titles: dict[int, str], focused: int | None) -> None:
        """Draw ``pool`` (a state per block) and a legend.

        ``owners`` maps blocks to request ids, ``session_of`` request ids to sessions,
        ``titles`` sessions to their titles; the focused session's blocks are bold.
        """
        text = Text()
        present: set[int] = set()
        for block, state in enumerate(pool):
            if state == "used":
                session = next((session_of[rid] for rid in owners.get(block, [])
                                if rid in session_of), None)
                present.add(session)
                colour = UNKNOWN if session is None else owner_colour(session)
                text.append(CELL, style=f"bold {colour}" if session == focused else colour)
            else:
                text.append(*_MARKS.get(state, _MARKS["free"]))
        text.append("\n")
        for session in sorted(present - {None}):
            text.append(CELL + " ", style=owner_colour(session))
            text.append(titles.get(session, f"#{session}")[:16] + "  ")
        for label, (cell, colour) in _MARKS.items():
            text.append(cell + " ", style=colour)
            text.append(label + "  ")
        self.update(text)
