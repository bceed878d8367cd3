"""The turn lifecycle: a message goes to the engine, its reply streams back, ends or is cancelled.

The ``EngineDriver`` thread's events reach the UI thread as ``EngineEvent`` messages, handed
to ``Replies.take``, so every widget is touched from the UI thread only. A reply's text is
saved while it streams and when it ends: quitting or a crash loses at most its last moment."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from textual.message import Message as TextualMessage

from pagedchat.chat.conversation import DEFAULT_TITLE, Message, Session, title_from
from pagedchat.chat.driver import (
    LOOPED,
    EngineFailed,
    EngineReady,
    Event,
    PromptReady,
    ReplyUpdate,
    RequestFailed,
    StatsUpdate,
    Submit,
)
from pagedchat.chat.prompt import PLAIN_FORMAT_NOTE
from pagedchat.chat.store import Store
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.tui.widgets.inspector import Inspector
from pagedchat.tui.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from textual.widget import Widget

    from pagedchat.chat.driver import EngineDriver
    from pagedchat.tui.widgets.chat_view import ChatView
    from pagedchat.tui.widgets.message_box import MessageBox

    W = TypeVar("W", bound=Widget)

SAVE_EVERY = 1.0  # seconds between saves of a streaming reply


class EngineEvent(TextualMessage):
    """An event of the engine driver, posted from its thread."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


@dataclass
class Turn:
    """A reply being generated."""

    session: Session
    reply: Message
    saved_at: float = 0.0
    # a continued reply: its text and tokens before, which the new ones follow
    before: str = ""
    tokens_before: int = 0


class ReplyHost(Protocol):
    """What the replies ask of the chat app (so that they do not import the app)."""

    store: Store
    model_name: str
    sub_title: str

    def notify(self, message: str, *, title: str = ..., severity: str = ...,
               timeout: float | None = ...) -> None: ...
    def query_one(self, selector: type[W]) -> W: ...
    def view(self, session_id: int) -> ChatView | None: ...
    def save(self, write: Callable[[], object], failed: str = ...) -> bool: ...
    def show_sessions(self) -> None: ...
    def show_inspector_focus(self) -> None: ...


class Replies:
    """The replies being generated, by request id, and what the engine said of them."""

    def __init__(self, app: ReplyHost, driver: EngineDriver, context_window: int,
                 raw: bool = False) -> None:
        self.app = app
        self.driver = driver
        self.context_window = context_window
        self.raw = raw  # plain continuation, no chat format
        self.turns: dict[str, Turn] = {}
        self.session_of: dict[str, int] = {}  # every request id of this run -> its session
        # every request id of this run -> the messages it answered, its reply last
        self.paths: dict[str, list[Message]] = {}
        self.engine_ready = False
        self._request_numbers = itertools.count(1)

    def busy_sessions(self) -> set[int]:
        return {turn.session.id for turn in self.turns.values()}

    def reply_of(self, session_id: int | None) -> str | None:
        """The request id of the reply ``session_id`` is generating, if any."""
        return next((rid for rid, t in self.turns.items() if t.session.id == session_id), None)

    async def send(self, session: Session, text: str, instead_of: Message | None = None) -> bool:
        """Save ``text`` as the session's next message and ask for a reply; with ``instead_of``
        (an earlier user message), as an edit of it: a new branch sharing what came before,
        the old one kept. False (the text stays in the input) when it could not be sent."""
        app = self.app
        if (params := self._params(session)) is None:
            return False
        user = Message("user", text)
        reply = Message("assistant", "", status="generating")
        if not app.save(lambda: app.store.add_turn(session, user, reply, instead_of),
                        "The message was not sent"):
            return False
        if instead_of is not None:
            session.messages = session.messages[: session.messages.index(instead_of)]
            user.branch = _last_of(app.store.alternatives(user))
            await app.view(session.id).show_messages()
        session.messages.append(user)
        if session.title == DEFAULT_TITLE:
            session.title = app.sub_title = title_from(text)
            app.save(lambda: app.store.save_session(session))
        await app.view(session.id).add(user)
        await self._answer(session, reply, params)
        return True

    async def regenerate(self, session: Session) -> bool:
        """Write another reply to the session's last message; the one shown stays, as an
        alternative (its prompt's blocks are found in the prefix cache)."""
        app = self.app
        last = session.messages[-1] if session.messages else None
        if last is None or last.role != "assistant" or len(session.messages) < 2:
            app.notify("There is no reply to regenerate", severity="warning")
            return False
        if (params := self._params(session)) is None:
            return False
        reply = Message("assistant", "", status="generating")
        if not app.save(lambda: app.store.add_reply(session, session.messages[-2], reply)):
            return False
        reply.branch = _last_of(app.store.alternatives(reply))
        session.messages.pop()
        if (box := app.view(session.id).box_for(last)) is not None:
            await box.remove()
        await self._answer(session, reply, params)
        return True

    async def continue_reply(self, session: Session) -> bool:
        """Go on with the session's last reply where it stopped (cut by max_tokens, Esc,
        the app's end or the repetition guard), in the same message."""
        app = self.app
        reply = session.messages[-1] if session.messages else None
        if reply is None or reply.role != "assistant" or not reply.content:
            app.notify("There is no reply to continue", severity="warning")
            return False
        if (params := self._params(session)) is None:
            return False
        self._submit(Turn(session, reply, time.monotonic(), reply.content, reply.output_tokens),
                     params)
        reply.status = "generating"
        if (box := app.view(session.id).box_for(reply)) is not None:
            box.resume()
        app.show_sessions()
        return True

    def _params(self, session: Session) -> SamplingParams | None:
        """The session's sampling parameters, or None (the user told why) if it may not reply."""
        if self.reply_of(session.id) is not None:
            self.app.notify("This session is still answering: wait, or press Esc to stop it",
                            severity="warning")
            return None
        try:
            return session.settings.to_params()
        except ValueError as error:  # settings edited outside the app
            self.app.notify(f"{error}; fix it with /set", title="Not sent", severity="error")
            return None

    async def _answer(self, session: Session, reply: Message, params: SamplingParams) -> None:
        """Ask the engine for ``reply`` to the session's messages, and show it."""
        session.messages.append(reply)
        self._submit(Turn(session, reply, time.monotonic()), params)
        box = await self.app.view(session.id).add(reply)
        box.refresh_info("" if self.engine_ready else "waiting for the model")
        self.app.show_sessions()

    def _submit(self, turn: Turn, params: SamplingParams) -> None:
        """Ask the engine for ``turn``'s reply (one with text already, ``turn.before``, goes on)."""
        session = turn.session
        rid = f"s{session.id}-r{next(self._request_numbers)}"
        self.turns[rid] = turn
        self.session_of[rid] = session.id
        self.paths[rid] = list(session.messages)
        self.driver.submit(Submit(rid, session.system_prompt, session.history(), params,
                                  self.context_window, self.raw, session.settings.loop_guard,
                                  continue_reply=bool(turn.before)))

    def cancel(self, session_id: int | None) -> bool:
        """Stop the session's reply; its blocks are freed, its text kept."""
        if (rid := self.reply_of(session_id)) is None:
            return False
        self.driver.cancel(rid)
        self.finish(rid, "cancelled")
        return True

    def drop(self, session: Session) -> None:
        """Stop the session's reply without saving it: its messages are going away."""
        for rid, turn in list(self.turns.items()):
            if turn.session is session:
                self.driver.cancel(rid)
                del self.turns[rid]

    def interrupt_all(self) -> None:
        """The app quits: every reply keeps its text so far, marked interrupted."""
        for turn in self.turns.values():
            turn.reply.status = "interrupted"
            self.app.save(lambda reply=turn.reply: self.app.store.update_message(reply))

    def finish(self, rid: str, status: str, error: str = "") -> None:
        turn = self.turns.pop(rid)
        turn.reply.status = status
        turn.reply.error = error
        self.app.save(lambda: self.app.store.update_message(turn.reply))
        if (box := self._box(turn)) is not None:
            box.finish()
        self.app.show_sessions()

    def take(self, event: Event) -> None:
        """Show what the engine said."""
        app = self.app
        match event:
            case ReplyUpdate() as update:
                self._take_reply(update)
            case StatsUpdate() as update:
                self._take_stats(update)
            case PromptReady() as ready:
                self._take_prompt(ready)
            case RequestFailed(request_id=rid, error=error):
                if rid in self.turns:
                    self.finish(rid, "error", error)
                    app.notify(error, title="The reply failed", severity="error", timeout=8)
            case EngineReady() as ready:
                self._take_ready(ready)
            case EngineFailed(error=error):
                app.query_one(StatusLine).show_state(f"✗ {app.model_name}: failed to load")
                app.notify(error, title="The model failed to load", severity="error", timeout=15)

    def _box(self, turn: Turn) -> MessageBox | None:
        view = self.app.view(turn.session.id)
        return view.box_for(turn.reply) if view is not None else None

    def _take_prompt(self, ready: PromptReady) -> None:
        if (turn := self.turns.get(ready.request_id)) is None:
            return
        turn.reply.prompt_tokens = ready.prompt_tokens
        turn.reply.dropped_messages = ready.dropped_messages
        if (box := self._box(turn)) is not None:
            box.refresh_info()
        if ready.truncated:
            self.app.notify(f"Only the end of your message fits the context window of "
                            f"{self.context_window} tokens; the rest was not sent",
                            severity="warning", timeout=8)

    def _take_ready(self, ready: EngineReady) -> None:
        self.engine_ready = True
        if not ready.chat_template and not self.raw:
            self.app.notify(PLAIN_FORMAT_NOTE, title=self.app.model_name, timeout=10)
        self.app.query_one(StatusLine).show_state(
            f"● {self.app.model_name} · {ready.num_blocks} blocks x {ready.block_size} tokens")
        for turn in self.turns.values():
            if (box := self._box(turn)) is not None:
                box.refresh_info()

    def _take_reply(self, update: ReplyUpdate) -> None:
        turn = self.turns.get(update.request_id)
        if turn is None:  # cancelled or deleted meanwhile
            return
        reply = turn.reply
        reply.content = turn.before + update.text
        reply.prompt_tokens = update.prompt_tokens
        reply.cached_tokens = update.cached_tokens
        reply.output_tokens = turn.tokens_before + update.output_tokens
        reply.draft_tokens, reply.accepted_tokens = update.draft_tokens, update.accepted_tokens
        if update.finished:
            status = {"abort": "cancelled", LOOPED: "looped"}.get(update.finish_reason, "done")
            self.finish(update.request_id, status)
            return
        if time.monotonic() - turn.saved_at >= SAVE_EVERY:
            turn.saved_at = time.monotonic()
            self.app.save(lambda: self.app.store.update_message(reply))

    def _take_stats(self, update: StatsUpdate) -> None:
        self.app.query_one(Inspector).add_snapshot(update)
        self.app.show_inspector_focus()
        s = update.stats
        parts = [f"{len(self.turns)} answering"] if self.turns else []
        parts.append(f"KV {s.used_blocks}/{s.total_blocks} blocks")
        if update.tokens_per_second:
            parts.append(f"{update.tokens_per_second:.0f} tok/s")
        self.app.query_one(StatusLine).load = " · ".join(parts)


def _last_of(alternatives: list[int]) -> tuple[int, int]:
    """The place of the newest of ``alternatives`` among them."""
    return len(alternatives), len(alternatives)
