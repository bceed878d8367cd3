"""The block table of the focused session: logical -> physical, fill, refs, sharing."""

from __future__ import annotations

from textual.widgets import DataTable

from pagedchat.engine.stats import SeqBlockTable


class BlockTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.add_columns("log", "phys", "fill", "ref", "marks")

    def show(self, tables: list[SeqBlockTable], block_size: int) -> None:
        self.clear()
        for table in tables:
            for entry in table.blocks:
                marks = [word for word, on in (("shared", entry.shared), ("cached", entry.cached))
                         if on]
                self.add_row(entry.logical, entry.physical,
                             f"{entry.filled}/{block_size}", entry.ref_count, " ".join(marks))
