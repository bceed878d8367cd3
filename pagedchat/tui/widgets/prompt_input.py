"""The box the user types into: Enter sends, Ctrl+J (or Shift+Enter) starts a new line."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    BINDINGS = [Binding("ctrl+j,shift+enter", "newline", "New line", show=False)]

    @dataclass
    class Submitted(Message):
        prompt_input: PromptInput
        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(
            placeholder="Message · Enter sends · Ctrl+J new line · /help",
            soft_wrap=True, show_line_numbers=False, **kwargs,
        )

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self, self.text.strip()))
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")
