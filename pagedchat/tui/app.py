"""The chat app: sessions on the left, the chat in the middle, the engine inspector on the right.

The engine lives in an ``EngineDriver`` thread; its events arrive here as ``EngineEvent``
messages, so every widget is touched from the UI thread only. Attributes go down to the
widgets (``show``/``refresh_info`` calls), messages come up from them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message as TextualMessage
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, OptionList

from pagedchat.chat import export
from pagedchat.chat.conversation import (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_TITLE,
    Message,
    SamplingSettings,
    Session,
    title_from,
)
from pagedchat.chat.driver import (
    EngineDriver,
    EngineFailed,
    EngineReady,
    Event,
    PromptReady,
    ReplyUpdate,
    RequestFailed,
    StatsUpdate,
    Submit,
)
from pagedchat.chat.prompt import DEFAULT_CONTEXT_WINDOW, PLAIN_FORMAT_NOTE
from pagedchat.chat.store import Store, StoreError
from pagedchat.tui import slash
from pagedchat.tui.screens.confirm import ConfirmScreen
from pagedchat.tui.screens.help import HelpScreen
from pagedchat.tui.screens.rename import RenameScreen
from pagedchat.tui.widgets.chat_view import ChatView, view_id
from pagedchat.tui.widgets.inspector import Inspector
from pagedchat.tui.widgets.prompt_input import PromptInput
from pagedchat.tui.widgets.session_list import SessionList
from pagedchat.tui.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from pagedchat.engine.llm_engine import LLMEngine

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


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "pagedchat"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True, tooltip="Quit (replies so far are kept)"),
        Binding("f1", "help", "Help", tooltip="This help"),
        Binding("escape", "cancel_reply", "Cancel",
                tooltip="Stop the focused session's reply and free its blocks"),
        Binding("ctrl+n", "new_session", "New", tooltip="Start a new session"),
        Binding("f2", "rename_session", "Rename", tooltip="Rename the focused session"),
        Binding("f8", "delete_session", "Delete",
                tooltip="Delete the focused session (asks first)"),
        Binding("f3", "toggle_inspector", "Inspector",
                tooltip="Show or hide the KV cache inspector"),
        Binding("ctrl+pageup", "switch_session(-1)", "Previous chat", show=False,
                tooltip="Switch to the session above"),
        Binding("ctrl+pagedown", "switch_session(1)", "Next chat", show=False,
                tooltip="Switch to the session below"),
    ]

    def __init__(
        self,
        store: Store,
        load_engine: Callable[[], LLMEngine],
        model_name: str,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        raw: bool = False,
        session_id: int | None = None,
        continue_last: bool = False,
        settings: SamplingSettings | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        """``settings`` and ``system_prompt`` are those of new sessions."""
        super().__init__()
        self.store = store
        self.model_name = model_name
        self.context_window = context_window
        self.raw = raw  # plain continuation, no chat format
        self.new_settings = settings or SamplingSettings()
        self.new_system_prompt = system_prompt
        self.driver = EngineDriver(load_engine, lambda event: self.post_message(EngineEvent(event)))
        self.sessions: dict[int, Session] = {}
        self.current: int | None = None
        self.turns: dict[str, Turn] = {}  # by request id
        self.session_of: dict[str, int] = {}  # every request id of this run -> its session
        self.engine_ready = False
        self.engine_stopped = False
        self._start_session = session_id
        self._continue_last = continue_last
        self._loaded: set[int] = set()  # sessions whose messages are read
        self._request_numbers = itertools.count(1)
        self._load_started = time.monotonic()

    # layout and start-up

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield SessionList(id="sessions")
            with Vertical(id="main"):
                yield ContentSwitcher(id="chats")
                yield PromptInput(id="input")
            yield Inspector(id="inspector")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        self.driver.start()
        self.query_one(StatusLine).show_loading(self.model_name, self._load_started)
        self._save(self.store.mark_interrupted)
        try:
            self.sessions = {s.id: s for s in self.store.list_sessions()}
        except StoreError as error:
            self.notify(str(error), title="Could not read the sessions", severity="error")
        await self.open_session(self._first_session())
        self.query_one(PromptInput).focus()

    def _first_session(self) -> int | None:
        if self._start_session is not None:
            if self._start_session in self.sessions:
                return self._start_session
            self.notify(f"There is no session {self._start_session}; starting a new one",
                        severity="warning")
        ordered = self._ordered()
        if ordered and (self._continue_last or not self._messages(ordered[0])):
            return ordered[0].id
        return self._create_session()

    def _create_session(self, title: str = DEFAULT_TITLE) -> int | None:
        session = Session(title=title, system_prompt=self.new_system_prompt,
                          settings=replace(self.new_settings))
        try:
            self.store.create_session(session)
        except StoreError as error:
            self.notify(str(error), title="Could not create a session", severity="error")
            return None
        self.sessions[session.id] = session
        return session.id

    def on_unmount(self) -> None:
        for turn in self.turns.values():
            turn.reply.status = "interrupted"
            self._save(lambda reply=turn.reply: self.store.update_message(reply))
        self.engine_stopped = self.driver.stop(timeout=2.0)
        self.store.close()

    # sessions

    def _ordered(self) -> list[Session]:
        return sorted(self.sessions.values(), key=lambda s: (s.updated_at, s.id), reverse=True)

    def _messages(self, session: Session) -> list[Message]:
        if session.id not in self._loaded:
            try:
                session.messages = self.store.load_messages(session.id)
            except StoreError as error:
                self.notify(str(error), title="Could not read the messages", severity="error")
            self._loaded.add(session.id)
        return session.messages

    @property
    def session(self) -> Session | None:
        """The focused session."""
        return self.sessions.get(self.current)

    async def open_session(self, session_id: int | None) -> None:
        """Show session ``session_id`` (its view is made the first time)."""
        if session_id not in self.sessions:
            return
        session = self.sessions[session_id]
        self._messages(session)
        switcher = self.query_one(ContentSwitcher)
        if not switcher.query(f"#{view_id(session_id)}"):
            await switcher.add_content(ChatView(session))
        switcher.current = view_id(session_id)
        self.current = session_id
        self.sub_title = session.title
        self._show_sessions()
        self._show_inspector_focus()

    def _show_sessions(self) -> None:
        busy = {turn.session.id for turn in self.turns.values()}
        self.query_one(SessionList).show(self._ordered(), self.current, busy)

    def _view(self, session_id: int) -> ChatView | None:
        views = self.query(f"#{view_id(session_id)}")
        return views.first(ChatView) if views else None

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        await self.open_session(SessionList.session_id(event.option))

    async def action_switch_session(self, step: int) -> None:
        ordered = [s.id for s in self._ordered()]
        if self.current in ordered:
            await self.open_session(ordered[(ordered.index(self.current) + step) % len(ordered)])

    async def action_new_session(self, title: str = DEFAULT_TITLE) -> None:
        await self.open_session(self._create_session(title))
        self.query_one(PromptInput).focus()

    def action_rename_session(self) -> None:
        if self.session is not None:
            self.push_screen(RenameScreen(self.session.title), self._rename)

    def _rename(self, title: str | None) -> None:
        session = self.session
        if title and session is not None:
            session.title = title
            self.sub_title = title
            self._save(lambda: self.store.save_session(session))
            self._show_sessions()
            self._show_inspector_focus()

    def action_delete_session(self) -> None:
        session = self.session
        if session is None:
            return
        count = len(self._messages(session))
        question = f"Delete the session “{session.title}” and its {count} messages?"
        self.push_screen(ConfirmScreen(question, yes="Delete"),
                         lambda yes: self._delete(session) if yes else None)

    async def _delete(self, session: Session) -> None:
        try:
            self.store.delete_session(session.id)
        except StoreError as error:
            self.notify(str(error), title="Could not delete", severity="error")
            return
        for rid, turn in list(self.turns.items()):
            if turn.session is session:
                self.driver.cancel(rid)
                del self.turns[rid]
        del self.sessions[session.id]
        view = self._view(session.id)
        if view is not None:
            await view.remove()
        ordered = self._ordered()
        await self.open_session(ordered[0].id if ordered else self._create_session())
        self.notify(f"Deleted “{session.title}”")

    # sending, streaming, cancelling

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        command = slash.parse(event.text)
        if command is not None:
            done = await self.run_slash(*command)
        else:
            done = await self.send(event.text)
        if done:
            event.prompt_input.clear()

    async def send(self, text: str) -> bool:
        """Save ``text`` as the focused session's next message and ask for a reply.

        Returns False (the text stays in the input) when it could not be sent."""
        session = self.session
        if session is None:
            self.notify("No session is open", severity="error")
            return False
        if self._reply_of(session.id) is not None:
            self.notify("This session is still answering: wait, or press Esc to stop it",
                        severity="warning")
            return False
        try:
            params = session.settings.to_params()
        except ValueError as error:  # settings edited outside the app
            self.notify(f"{error}; fix it with /set", title="Not sent", severity="error")
            return False
        user = Message("user", text)
        try:
            self.store.add_message(session, user)
        except StoreError as error:
            self.notify(f"The message was not sent: {error}", title="Could not save",
                        severity="error")
            return False
        session.messages.append(user)
        if session.title == DEFAULT_TITLE:
            session.title = self.sub_title = title_from(text)
            self._save(lambda: self.store.save_session(session))
        reply = Message("assistant", "", status="generating")
        self._save(lambda: self.store.add_message(session, reply))
        rid = f"s{session.id}-r{next(self._request_numbers)}"
        self.turns[rid] = Turn(session, reply, time.monotonic())
        self.session_of[rid] = session.id
        self.driver.submit(Submit(rid, session.system_prompt, session.history(), params,
                                  self.context_window, self.raw))
        session.messages.append(reply)
        view = self._view(session.id)
        await view.add(user)
        box = await view.add(reply)
        box.refresh_info("" if self.engine_ready else "waiting for the model")
        self._show_sessions()
        return True

    def _reply_of(self, session_id: int | None) -> str | None:
        return next((rid for rid, t in self.turns.items() if t.session.id == session_id), None)

    def action_cancel_reply(self) -> None:
        """Stop the focused session's reply; its blocks are freed, its text kept."""
        rid = self._reply_of(self.current)
        if rid is not None:
            self.driver.cancel(rid)
            self._finish(rid, "cancelled")
            self.notify("Reply cancelled")

    def _finish(self, rid: str, status: str, error: str = "") -> None:
        turn = self.turns.pop(rid)
        turn.reply.status = status
        turn.reply.error = error
        self._save(lambda: self.store.update_message(turn.reply))
        box = self._box(turn)
        if box is not None:
            box.finish()
        self._show_sessions()

    def _box(self, turn: Turn):
        view = self._view(turn.session.id)
        return view.box_for(turn.reply) if view is not None else None

    def on_engine_event(self, message: EngineEvent) -> None:
        if not self.is_running:  # shutting down: the widgets are being removed
            return
        match message.event:
            case ReplyUpdate() as update:
                self._take_reply(update)
            case StatsUpdate() as update:
                self._take_stats(update)
            case PromptReady() as ready:
                if (turn := self.turns.get(ready.request_id)) is not None:
                    turn.reply.prompt_tokens = ready.prompt_tokens
                    turn.reply.dropped_messages = ready.dropped_messages
                    if (box := self._box(turn)) is not None:
                        box.refresh_info()
                    if ready.truncated:
                        self.notify(f"Only the end of your message fits the context window of "
                                    f"{self.context_window} tokens; the rest was not sent",
                                    severity="warning", timeout=8)
            case RequestFailed(request_id=rid, error=error):
                if rid in self.turns:
                    self._finish(rid, "error", error)
                    self.notify(error, title="The reply failed", severity="error", timeout=8)
            case EngineReady() as ready:
                self._engine_ready(ready)
            case EngineFailed(error=error):
                self.query_one(StatusLine).show_state(f"✗ {self.model_name}: failed to load")
                self.notify(error, title="The model failed to load", severity="error",
                            timeout=15)

    def _engine_ready(self, ready: EngineReady) -> None:
        self.engine_ready = True
        if not ready.chat_template and not self.raw:
            self.notify(PLAIN_FORMAT_NOTE, title=self.model_name, timeout=10)
        self.query_one(StatusLine).show_state(
            f"● {self.model_name} · {ready.num_blocks} blocks x {ready.block_size} tokens")
        for turn in self.turns.values():
            if (box := self._box(turn)) is not None:
                box.refresh_info()

    def _take_reply(self, update: ReplyUpdate) -> None:
        turn = self.turns.get(update.request_id)
        if turn is None:  # cancelled or deleted meanwhile
            return
        reply = turn.reply
        reply.content = update.text
        reply.prompt_tokens = update.prompt_tokens
        reply.cached_tokens = update.cached_tokens
        reply.output_tokens = update.output_tokens
        if update.finished:
            self._finish(update.request_id,
                         "cancelled" if update.finish_reason == "abort" else "done")
            return
        if (box := self._box(turn)) is not None:
            box.refresh_info()
        if time.monotonic() - turn.saved_at >= SAVE_EVERY:
            turn.saved_at = time.monotonic()
            self._save(lambda: self.store.update_message(reply))

    def _take_stats(self, update: StatsUpdate) -> None:
        inspector = self.query_one(Inspector)
        inspector.add_snapshot(update)
        self._show_inspector_focus()
        s = update.stats
        parts = [f"{len(self.turns)} answering"] if self.turns else []
        parts.append(f"KV {s.used_blocks}/{s.total_blocks} blocks")
        if update.tokens_per_second:
            parts.append(f"{update.tokens_per_second:.0f} tok/s")
        self.query_one(StatusLine).load = " · ".join(parts)

    def _show_inspector_focus(self) -> None:
        titles = {sid: session.title for sid, session in self.sessions.items()}
        self.query_one(Inspector).show_focus(self.session_of, titles, self.current)

    def _save(self, write: Callable[[], object]) -> None:
        """Run a store write; a failure is shown, and the data stays in memory."""
        try:
            write()
        except StoreError as error:
            self.notify(str(error), title="Could not save", severity="error", timeout=8)

    # panels and screens

    def action_toggle_inspector(self) -> None:
        self.screen.toggle_class("-inspecting")
        self._show_inspector_focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New chat", "Start a new session", self.action_new_session)
        yield SystemCommand("Rename chat", "Rename the focused session",
                            self.action_rename_session)
        yield SystemCommand("Delete chat", "Delete the focused session (asks first)",
                            self.action_delete_session)
        yield SystemCommand("Clear chat", "Forget the focused session's messages",
                            lambda: self.run_slash("clear", ""))
        yield SystemCommand("Export chat", "Write the focused session as Markdown and JSON",
                            lambda: self.run_slash("export", ""))
        yield SystemCommand("Toggle inspector", "Show or hide the KV cache inspector",
                            self.action_toggle_inspector)
        yield SystemCommand("Cancel reply", "Stop the focused session's reply",
                            self.action_cancel_reply)
        yield SystemCommand("Help", "Keys and slash commands", self.action_help)

    # slash commands

    async def run_slash(self, name: str, argument: str) -> bool:
        """Run ``/name argument``; False (the text stays in the input) when it did not run."""
        handlers = {
            "new": self._slash_new, "system": self._slash_system, "set": self._slash_set,
            "clear": self._slash_clear, "rename": self._slash_rename,
            "export": self._slash_export, "help": self._slash_help,
        }
        if name not in handlers:
            self.notify(f"Unknown command /{name}: /help lists them", severity="error")
            return False
        if self.session is None and name != "new":
            self.notify("No session is open", severity="error")
            return False
        return await handlers[name](argument)

    async def _slash_new(self, argument: str) -> bool:
        await self.action_new_session(argument or DEFAULT_TITLE)
        return True

    async def _slash_help(self, argument: str) -> bool:
        self.action_help()
        return True

    async def _slash_system(self, argument: str) -> bool:
        session = self.session
        if not argument:
            self.notify(session.system_prompt or "(none)", title="System prompt")
            return True
        session.system_prompt = argument
        self._save(lambda: self.store.save_session(session))
        self.notify("System prompt set for the next replies")
        return True

    async def _slash_set(self, argument: str) -> bool:
        session = self.session
        name, _, value = argument.partition(" ")
        if not name:
            shown = ", ".join(f"{k} = {v}" for k, v in vars(session.settings).items())
            self.notify(shown, title="Settings")
            return True
        try:
            session.settings = session.settings.with_value(name, value.strip())
        except ValueError as error:
            self.notify(str(error), title="/set", severity="error")
            return False
        self._save(lambda: self.store.save_session(session))
        self.notify(f"{name} = {getattr(session.settings, name)}")
        return True

    async def _slash_clear(self, argument: str) -> bool:
        session = self.session
        if (rid := self._reply_of(session.id)) is not None:
            self.driver.cancel(rid)
            del self.turns[rid]
        try:
            self.store.clear_messages(session.id)
        except StoreError as error:
            self.notify(str(error), title="Could not clear", severity="error")
            return False
        session.messages.clear()
        await self._view(session.id).remove_children()
        self._show_sessions()
        return True

    async def _slash_rename(self, argument: str) -> bool:
        if argument:
            self._rename(argument)
        else:
            self.action_rename_session()
        return True

    async def _slash_export(self, argument: str) -> bool:
        session = self.session
        default = self.store.path.parent / "exports" / f"session-{session.id}.md"
        markdown_path = Path(argument).expanduser() if argument else default
        json_path = markdown_path.with_suffix(".json")
        try:
            markdown_path.parent.mkdir(parents=True, exist_ok=True)
            markdown_path.write_text(export.to_markdown(session), encoding="utf-8")
            json_path.write_text(export.to_json(session), encoding="utf-8")
        except OSError as error:
            self.notify(str(error), title="Could not export", severity="error")
            return False
        self.notify(f"{markdown_path}\n{json_path}", title="Exported")
        return True
