"""The inspector panel: live engine figures with their sparklines, the focused session's
block table (logical -> physical, tokens filled, refs, marks), and the whole KV pool, one cell
per physical block, coloured by owner, shared, cached or free."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import DataTable, Label, Sparkline, Static

from pagedchat.chat.conversation import Message
from pagedchat.chat.driver import StatsUpdate
from pagedchat.engine.outputs import EngineStats, SeqBlockTable
from pagedchat.tui.widgets.branch_sharing import BranchBlocks, branch_lines

HISTORY = 60  # snapshots kept per figure

# name, label, how it is shown, its value in a snapshot (the stats, tokens/s)
FIGURES: list[tuple[str, str, str, Callable[[EngineStats, float], float]]] = [
    ("kv_used", "KV used", "{:.0%}", lambda s, _: s.used_blocks / max(s.total_blocks, 1)),
    ("utilization", "utilization", "{:.0%}", lambda s, _: s.utilization),
    ("fragmentation", "fragmentation", "{:.1%}", lambda s, _: s.internal_fragmentation),
    ("hit_rate", "prefix hits", "{:.0%}", lambda s, _: s.prefix_hit_rate),
    ("preemptions", "preemptions", "{:.0f}", lambda s, _: float(s.preemptions)),
    ("tokens_per_second", "tokens/s", "{:.1f}", lambda _, rate: rate)]


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


class BlockTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.add_columns("log", "phys", "fill", "ref", "marks")

    def show(self, tables: list[SeqBlockTable]) -> None:
        self.clear()
        for table in tables:
            for entry in table.blocks:
                marks = [word for word, on in (("shared", entry.shared), ("cached", entry.cached))
                         if on]
                if table.window is not None:
                    marks.append(f"local {table.layer_group}")
                elif any(t.window is not None for t in tables):
                    marks.append(f"global {table.layer_group}")
                self.add_row(entry.logical, entry.physical, entry.filled, entry.ref_count,
                             " ".join(marks))


OWNER_COLOURS = ["#4ea8de", "#80ed99", "#f4a261", "#c77dff", "#ff6b6b", "#48cae4"]
SHARED, CACHED, FREE, UNKNOWN = "#ffd166", "#7d8597", "#4a4e5a", "#ffffff"
CELL = "■"
_MARKS = {"shared": (CELL, SHARED), "cached": (CELL, CACHED), "free": ("·", FREE)}


def owner_colour(session_id: int) -> str:
    return OWNER_COLOURS[session_id % len(OWNER_COLOURS)]


class PoolMap(Static):
    def show(self, pool: list[str], owners: dict[int, list[str]],
             session_of: dict[str, int], titles: dict[int, str], focused: int | None) -> None:
        """Draw ``pool`` (a state per block) and a legend, the focused session's blocks bold;
        ``owners``, ``session_of`` and ``titles`` map blocks to requests to sessions to titles."""
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


class Inspector(VerticalScroll):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.latest: StatsUpdate | None = None
        # per session, its last live block tables and sharing: a finished reply's blocks stay
        # shown ("last seen") instead of vanishing
        self._last_seen: dict[int, tuple[list[SeqBlockTable], str]] = {}
        self.branches = BranchBlocks()

    def compose(self) -> ComposeResult:
        yield Label("Engine", classes="section")
        yield Figures()
        yield Static("waiting for the model…", id="counts", markup=False)
        yield Label("Block table", id="table-title", classes="section")
        yield BlockTable()
        yield Static(id="sharing", markup=False)
        yield Label("KV pool", classes="section")
        yield PoolMap(id="pool-map")

    def add_snapshot(self, update: StatsUpdate) -> None:
        """Record a new engine snapshot: figures, their history and the counts."""
        self.latest = update
        s = update.stats
        self.branches.record(s.block_tables)
        self.query_one(Figures).add(s, update.tokens_per_second)
        self.query_one("#counts", Static).update(
            f"blocks  {s.used_blocks} used · {s.cached_blocks} cached · {s.free_blocks} free\n"
            f"seqs    {s.num_running} run · {s.num_waiting} wait · {s.num_swapped} swapped\n"
            f"shared  {s.shared_blocks} blocks · {s.saved_blocks} saved\n"
            f"prefix  {s.prefix_hits} of {s.prefix_queries} prompt tokens cached"
            + (_window_line(s) if s.has_windows else "")
            + (f"\nspec    {s.speculation()}" if s.speculative else "")
            + (f"\ndisk    {s.kv_store_read} blocks read back · {s.kv_store_written} "
               "written (KV store)" if s.kv_store_read is not None else ""))

    def show_focus(self, session_of: dict[str, int], titles: dict[int, str],
                   focused: int | None, paths: dict[str, list[Message]] | None = None) -> None:
        """Show session ``focused``'s block table and the pool map, from the latest snapshot;
        ``session_of`` maps request ids to sessions, ``titles`` sessions to titles, ``paths``
        request ids to the messages they answered (reply last), naming the sharing branches."""
        if self.latest is None:
            return
        s = self.latest.stats
        live = [t for t in s.block_tables
                if focused is not None and session_of.get(t.request_id) == focused]
        if live:
            ours = {rid: path for rid, path in (paths or {}).items()
                    if session_of.get(rid) == focused}
            lines = branch_lines(self.branches, sorted({t.request_id for t in live}), ours,
                                 s.block_size)
            sharing = _sharing(live, s.owners, session_of, titles, focused)
            self._last_seen[focused] = (live, "\n".join(filter(None, [sharing, *lines])))
        tables, sharing = self._last_seen.get(focused, ([], ""))
        state = "live" if live else "last seen" if tables else "none live"
        self.query_one("#table-title", Label).update(f"Blocks of this chat ({state})")
        self.query_one(BlockTable).show(tables)
        self.query_one("#sharing", Static).update(sharing)
        self.query_one(PoolMap).show(s.pool, s.owners, session_of, titles, focused)


def _window_line(s: EngineStats) -> str:
    """Blocks the global and local (sliding-window) layer groups hold, and the window freed."""
    held_global, held_local = s.held_by_kind()
    return (f"\nwindow  {held_global} global · {held_local} local held · "
            f"{s.window_freed_blocks} freed by the window")


def _sharing(tables: list[SeqBlockTable], owners: dict[int, list[str]],
             session_of: dict[str, int], titles: dict[int, str], focused: int) -> str:
    """"3 blocks shared with: Trip" for the blocks of ``tables`` other sessions also hold."""
    shared: dict[int, set[int]] = {}  # other session -> its blocks shared with ours
    for table in tables:
        for entry in table.blocks:
            for rid in owners.get(entry.physical, []):
                other = session_of.get(rid)
                if other is not None and other != focused:
                    shared.setdefault(other, set()).add(entry.physical)
    return "\n".join(f"{len(blocks)} blocks shared with: {titles.get(other, f'#{other}')}"
                     for other, blocks in sorted(shared.items()))
