"""The box the user types into: Enter sends, Ctrl+J (or Shift+Enter) starts a new line,
Up on the first line and Down on the last walk through the session's earlier inputs."""

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
        super().__init__(placeholder="Message · Enter sends · Ctrl+J new line · /help",
                         soft_wrap=True, show_line_numbers=False, **kwargs)
        self.inputs: list[str] = []  # earlier inputs, oldest first (not undo history)
        self._recalled: int | None = None  # index into history while walking it
        self._draft = ""  # what was typed before the walk began

    def remember(self, inputs: list[str]) -> None:
        """Take ``inputs`` (oldest first) as the history Up and Down walk; ends a walk."""
        self.inputs = list(inputs)
        self._recalled = None

    async def _on_key(self, event: events.Key) -> None:
        row = self.cursor_location[0]
        if event.key == "enter":
            if self.text.strip():
                self.post_message(self.Submitted(self, self.text.strip()))
        elif not (event.key == "up" and row == 0 and self._walk(-1)
                  or event.key == "down" and row == self.document.line_count - 1
                  and self._walk(1)):
            await super()._on_key(event)
            return
        event.stop()
        event.prevent_default()

    def _walk(self, step: int) -> bool:
        """Show the input ``step`` away from the one shown (the draft past the newest);
        False when there is none that way."""
        if not self.inputs:
            return False
        if self._recalled is None:
            if step > 0:
                return False
            self._draft, self._recalled = self.text, len(self.inputs)
        target = self._recalled + step
        if target < 0 or target > len(self.inputs):
            return False
        self._recalled = None if target == len(self.inputs) else target
        self.load_text(self._draft if self._recalled is None else self.inputs[target])
        self.move_cursor(self.document.end if step > 0 else (0, len(self.document[0])))
        return True

    def action_newline(self) -> None:
        self.insert("\n")
