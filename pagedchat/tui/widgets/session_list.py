"""The list of sessions, most recently used first; a dot marks one that is answering."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from pagedchat.chat.conversation import Session

TITLE_WIDTH = 19  # the list's width less its mark and border: one line per session


class SessionList(OptionList):
    def show(self, sessions: list[Session], current: int | None, busy: set[int]) -> None:
        """Show ``sessions`` with ``current`` highlighted and a mark on those in ``busy``."""
        options = []
        for session in sessions:
            mark = "● " if session.id in busy else "  "
            title = session.title
            if len(title) > TITLE_WIDTH:
                title = title[: TITLE_WIDTH - 1] + "…"
            label = Content.assemble((mark, "bold $text-success"), title)
            options.append(Option(label, id=str(session.id)))
        self.set_options(options)
        if current is not None:
            self.highlighted = self.get_option_index(str(current))

    @staticmethod
    def session_id(option: Option) -> int:
        return int(option.id)
