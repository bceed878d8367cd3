"""One message of the chat: who, the text as Markdown, and the figures of its turn.

A streaming reply is flushed to the Markdown widget on a timer, as appends of what is new, its
figures with it, and rendered once in full when it ends. The app's thread shares the cores with
the engine's kernels, and a flush of a long reply costs it more to lay out: a tick flushes only
where the thread was busy at most UI_SHARE of the time since the last flush, or MOST_SECONDS ago."""

from __future__ import annotations

import re
import time

from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as UIMessage
from textual.widgets import Label, Markdown, Static

from pagedchat.chat.conversation import Message

FLUSH_SECONDS, UI_SHARE, MOST_SECONDS = 0.1, 0.1, 1.0
_STATUS_WORDS = {"generating": "writing…", "cancelled": "cancelled",
                 "interrupted": "interrupted", "error": "failed", "unanswered": "no reply",
                 "looped": "stopped"}


class MessageMarkdown(Markdown):
    """Markdown whose last block has no margin (the caption follows it): set on that block
    alone after each change, where a :last-child rule restyles every block at each one."""

    _trimmed = None

    def update(self, markdown: str) -> AwaitComplete:
        return AwaitComplete(self._trim(super().update(markdown)))

    def append(self, markdown: str) -> AwaitComplete:
        return AwaitComplete(self._trim(super().append(markdown)))

    async def _trim(self, change: AwaitComplete) -> None:
        await change
        if self._trimmed is not None:
            self._trimmed.styles.clear_rule("margin")
        if self.children:
            self._trimmed = self.children[-1]
            self._trimmed.styles.margin = 0


class MessageBox(Vertical, can_focus=True):
    BINDINGS = [
        Binding("y", "copy_text", "Copy message"), Binding("c", "copy_code", "Copy code"),
        Binding("e", "edit", "Edit and resend")]

    class Copied(UIMessage):
        """Text went to the clipboard (the app gives the input its focus back)."""

    class EditAsked(UIMessage):
        """The user wants to edit this (user) message and send it again as a branch."""

        def __init__(self, message: Message) -> None:
            super().__init__()
            self.message = message

    def __init__(self, message: Message) -> None:
        super().__init__(classes=message.role)
        self.message = message
        self.note = ""  # e.g. "waiting for the model"
        self._timer = None
        self._flushed = (0.0, 0.0)  # when the last flush was, and the app thread's CPU time then
        # held, not queried: in the app's teardown a query can find the box but not its parts
        self._header_label = Label(self._header(), classes="header")
        self._markdown = MessageMarkdown(with_line_breaks(message.content))
        self._caption_static = Static(self._caption(), classes="caption", markup=False)

    def compose(self) -> ComposeResult:
        yield self._header_label
        yield self._markdown
        yield self._caption_static

    def on_mount(self) -> None:
        if self.message.status == "generating":
            self._timer = self.set_interval(FLUSH_SECONDS, self._flush)
        self._show_info()

    def refresh_info(self, note: str = "") -> None:
        """Redraw header and caption from the message (its status and figures changed)."""
        self.note = note
        if self.is_mounted:
            self._show_info()

    def resume(self) -> None:
        """The reply goes on (continued): stream again."""
        if self._timer is None and self.is_mounted:
            self._timer = self.set_interval(FLUSH_SECONDS, self._flush)
        self.refresh_info()

    def finish(self) -> None:
        """The reply ended: stop streaming and render the whole text once."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.note = ""
        if self.is_mounted:
            self._markdown.update(with_line_breaks(self.message.content))
            self._show_info()

    def _flush(self) -> None:
        now, busy = time.monotonic(), time.thread_time()
        if (busy - self._flushed[1] > UI_SHARE * (now - self._flushed[0])
                and now - self._flushed[0] < MOST_SECONDS):
            return
        self._flushed = now, busy
        self._show_info()
        markdown = self._markdown
        text, shown = with_line_breaks(self.message.content), markdown.source
        if text == shown:
            return
        if text.startswith(shown):
            markdown.append(text[len(shown):])
        else:
            markdown.update(text)

    def _show_info(self) -> None:
        self._header_label.update(self._header())
        caption = self._caption()
        self._caption_static.update(caption)
        self.set_class(not caption, "-no-caption")
        self.set_class(self.message.status == "error", "-error")

    def _header(self) -> str:
        who = "You" if self.message.role == "user" else "Assistant"
        word = self.note or _STATUS_WORDS.get(self.message.status, "")
        return f"{who} · {word}" if word else who

    def _caption(self) -> str:
        m = self.message
        place, count = m.branch
        parts = [f"{place}/{count} · Alt+←/→"] if count > 1 else []
        if m.role == "user":
            return " · ".join(parts)
        if m.prompt_tokens:
            parts.append(f"prompt {m.prompt_tokens} tok, {m.cached_tokens} cached")
        if m.output_tokens:
            parts.append(f"reply {m.output_tokens} tok")
        if m.draft_tokens:
            parts.append(f"speculative {m.accepted_tokens}/{m.draft_tokens} accepted")
        if m.dropped_messages:
            parts.append(f"{m.dropped_messages} older messages dropped")
        if m.status == "looped":
            parts.append("stopped: it began repeating itself (/set loop_guard off to allow)")
        if m.error:
            parts.append(m.error)
        return " · ".join(parts)

    def action_copy_text(self) -> None:
        self._copy(self.message.content, "Message copied")

    def action_edit(self) -> None:
        if self.message.role == "user":
            self.post_message(self.EditAsked(self.message))
        else:
            self.notify("Only your messages can be edited (Ctrl+R writes another reply)",
                        severity="warning")

    def action_copy_code(self) -> None:
        if not (blocks := code_blocks(self.message.content)):
            self.notify("No code block in this message", severity="warning")
            return
        self._copy(blocks[-1], "Code block copied")

    def _copy(self, text: str, done: str) -> None:
        self.app.copy_to_clipboard(text)
        self.notify(done)
        self.post_message(self.Copied())


def with_line_breaks(text: str) -> str:
    """``text`` as Markdown that keeps its single line breaks (a poem's lines): each line
    that ends outside a code block ends with a hard break. A line is changed only once it
    has ended, so a streamed reply's shown text only grows."""
    lines = text.split("\n")
    in_code = False
    for i, line in enumerate(lines[:-1]):
        fence = line.lstrip().startswith("```")
        if fence:
            in_code = not in_code
        elif not in_code and line.strip():
            lines[i] = line + "  "
    return "\n".join(lines)


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks in ``text``, in order."""
    return re.findall(r"^[ \t]*```[^\n]*\n(.*?)\n?^[ \t]*```", text, re.MULTILINE | re.DOTALL)
