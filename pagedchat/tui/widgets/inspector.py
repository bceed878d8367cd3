"""The inspector panel: live engine figures, the focused session's block table, the pool."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from pagedchat.chat.conversation import Message
from pagedchat.chat.driver import StatsUpdate
from pagedchat.engine.outputs import EngineStats, SeqBlockTable
from pagedchat.tui.widgets.block_table import BlockTable
from pagedchat.tui.widgets.branch_sharing import BranchBlocks, branch_lines
from pagedchat.tui.widgets.figures import Figures
from pagedchat.tui.widgets.pool_map import PoolMap


class Inspector(VerticalScroll):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.latest: StatsUpdate | None = None
        # Per session, its last live block tables and what they shared: a finished
        # reply's blocks stay visible (marked "last seen") instead of vanishing.
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
               "written (KV store)" if s.kv_store_read is not None else "")
        )

    def show_focus(self, session_of: dict[str, int], titles: dict[int, str],
                   focused: int | None, paths: dict[str, list[Message]] | None = None,
                   ) -> None:
        """Show the block table of session ``focused`` and the pool map, from the latest snapshot.

        ``session_of`` maps request ids to sessions, ``titles`` sessions to their titles,
        ``paths`` request ids to the messages they answered (their reply last), which names
        the branches of the session that share its blocks.
        """
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
    """Blocks held by the global and the local (sliding-window) layer groups, and those the
    window gave back."""
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
