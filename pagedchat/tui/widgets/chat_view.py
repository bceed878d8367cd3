"""The messages of one session, kept scrolled to the newest unless the user scrolls up."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll

from pagedchat.chat.conversation import Message, Session
from pagedchat.tui.widgets.message_box import MessageBox


class ChatView(VerticalScroll):
    def __init__(self, session: Session) -> None:
        super().__init__(id=view_id(session.id))
        self.session = session

    def compose(self) -> ComposeResult:
        for message in self.session.messages:
            yield MessageBox(message)

    def on_mount(self) -> None:
        self.anchor()

    async def show_messages(self) -> None:
        """Show the session's messages anew (its branch changed)."""
        await self.remove_children()
        await self.mount_all([MessageBox(message) for message in self.session.messages])

    async def add(self, message: Message) -> MessageBox:
        box = MessageBox(message)
        await self.mount(box)
        return box

    def box_for(self, message: Message) -> MessageBox | None:
        for box in self.query(MessageBox):
            if box.message is message:
                return box
        return None


def view_id(session_id: int) -> str:
    return f"chat-{session_id}"
