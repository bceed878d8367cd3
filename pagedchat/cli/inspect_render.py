"""An engine stats snapshot as pictures: the block pool, the block tables, the figures.

``owner_letters`` is plain data any front end can draw; the rest builds rich renderables for
``pagedchat inspect``, each state with its own character, readable without colours (piped)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from pagedchat.engine.outputs import EngineStats, SeqBlockTable


PALETTE = ("cyan", "magenta", "yellow", "green", "blue", "red", "bright_cyan",
           "bright_magenta", "bright_yellow", "bright_green", "bright_blue", "bright_red")
FREE, CACHED, SHARED = ".", "c", "+"
STYLES = {FREE: "grey35", CACHED: "dim green", SHARED: "bold white on dark_magenta"}


def owner_letters(stats: EngineStats) -> dict[str, str]:
    """A letter per request holding blocks, in order of first appearance (a, b, ...)."""
    request_ids = dict.fromkeys(table.request_id for table in stats.block_tables)
    return {rid: chr(ord("a") + i % 26) for i, rid in enumerate(request_ids)}


def _style(letter: str) -> str:
    return PALETTE[(ord(letter) - ord("a")) % len(PALETTE)]


def pool_grid(stats: EngineStats, width: int = 64) -> Text:
    """The pool, ``width`` blocks a row: owner letter (used), + shared, c cached, . free."""
    letters = owner_letters(stats)
    text = Text()
    for block, state in enumerate(stats.pool):
        if block and block % width == 0:
            text.append("\n")
        owner = (stats.owners.get(block) or [None])[0]
        if state == "used" and owner in letters:
            text.append(letters[owner], f"bold {_style(letters[owner])}")
        else:
            mark = {"shared": SHARED, "cached": CACHED}.get(state, FREE)
            text.append(mark, STYLES[mark])
    return text


def legend(stats: EngineStats) -> Text:
    text = Text()
    for request_id, letter in owner_letters(stats).items():
        text.append(f"{letter}", f"bold {_style(letter)}")
        text.append(f"={request_id}  ")
    for mark, meaning in ((SHARED, " shared  "), (CACHED, " cached (evictable)  "),
                          (FREE, " free")):
        text.append(mark, STYLES[mark])
        text.append(meaning)
    return text


def group_label(table: SeqBlockTable) -> str:
    """``global`` or ``local 2 (window 512, 30 slid out)``: a table's layer group."""
    if table.window is None:
        return f"global {table.layer_group}"
    return f"local {table.layer_group} (window {table.window}, {table.slid_out} slid out)"


def block_tables(stats: EngineStats) -> Table:
    """Each running sequence: logical -> physical, fill / block size, reference count; one
    row per layer group where the model has sliding-window layers."""
    table = Table(title="block tables (logical:physical fill ref)", title_justify="left",
                  show_edge=False, pad_edge=False)
    table.add_column("request")
    table.add_column("seq", justify="right")
    windowed = stats.has_windows
    if windowed:
        table.add_column("layer group")
    table.add_column("blocks")
    for seq in stats.block_tables:
        blocks = Text()
        for entry in seq.blocks:
            style = STYLES[SHARED] if entry.shared else ("green" if entry.cached else "")
            blocks.append(f"{entry.logical}:{entry.physical} "
                          f"{entry.filled}/{stats.block_size} x{entry.ref_count}", style)
            blocks.append("  ")
        group = [group_label(seq)] if windowed else []
        table.add_row(seq.request_id, str(seq.seq_index), *group, blocks)
    return table


def figures(stats: EngineStats) -> dict[str, object]:
    """The numbers under the picture, by stable names."""
    return {
        "used_blocks": f"{stats.used_blocks}/{stats.total_blocks}",
        "kv_cache_dtype": stats.kv_cache_dtype, "cached_blocks": stats.cached_blocks,
        "utilization": f"{stats.utilization:.1%}",
        "internal_fragmentation": f"{stats.internal_fragmentation:.1%}",
        "shared_blocks": stats.shared_blocks, "blocks_saved_by_sharing": stats.saved_blocks,
        "prefix_hits": f"{stats.prefix_hits}/{stats.prefix_queries}",
        "preemptions": stats.preemptions,
        "swapped_out_in": f"{stats.swapped_out}/{stats.swapped_in}",
        "running_waiting_swapped": f"{stats.num_running}/{stats.num_waiting}/"
                                   f"{stats.num_swapped}",
        "speculative_decoding": stats.speculation(),
        **(window_figures(stats) if stats.has_windows else {})}


def window_figures(stats: EngineStats) -> dict[str, object]:
    """For a model with sliding-window layers: the blocks held by each kind of layer group
    and those given back to the pool as they slid out of the window."""
    held_global, held_local = stats.held_by_kind()
    groups = stats.group_windows
    return {
        "layer_groups_global_local": f"{groups.count(None)}/{len(groups) - groups.count(None)}",
        "blocks_held_global_local": f"{held_global}/{held_local}",
        "blocks_freed_by_window": stats.window_freed_blocks}


def snapshot(title: str, stats: EngineStats) -> Group:
    """Everything ``inspect`` shows after one step."""
    numbers = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    numbers.add_column(style="bold")
    numbers.add_column(justify="right")
    for name, value in figures(stats).items():
        numbers.add_row(name.replace("_", " "), str(value))
    parts = [Text(title, style="bold underline"), pool_grid(stats), legend(stats)]
    if stats.block_tables:
        parts.append(block_tables(stats))
    return Group(*parts, numbers, Text(""))
