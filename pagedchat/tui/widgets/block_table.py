"""The block table of the focused session: logical -> physical, tokens filled, refs, marks."""

from __future__ import annotations

from textual.widgets import DataTable

from pagedchat.engine.outputs import SeqBlockTable


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
