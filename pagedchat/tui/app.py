"""The chat app: sessions on the left, the chat in the middle, the engine inspector on the right.

The app owns the sessions and the layout, ``Replies`` the turns and the engine's events,
``commands/`` the slash commands; calls go down to the widgets, messages come up from them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, OptionList

from pagedchat.chat.conversation import (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_TITLE,
    Message,
    SamplingSettings,
    Session,
)
from pagedchat.chat.driver import EngineDriver
from pagedchat.chat.prompt import DEFAULT_CONTEXT_WINDOW
from pagedchat.chat.store import Store, StoreError
from pagedchat.tui.commands import parse, run_slash
from pagedchat.tui.replies import EngineEvent, Replies
from pagedchat.tui.screens.confirm import ConfirmScreen, RenameScreen
from pagedchat.tui.screens.help import HelpScreen
from pagedchat.tui.widgets.chat_view import ChatView, view_id
from pagedchat.tui.widgets.inspector import Inspector
from pagedchat.tui.widgets.message_box import MessageBox
from pagedchat.tui.widgets.prompt_input import PromptInput
from pagedchat.tui.widgets.session_list import SessionList
from pagedchat.tui.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from pagedchat.engine.llm_engine import LLMEngine

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
        Binding("ctrl+r", "regenerate", "Regenerate", show=False, priority=True,
                tooltip="Write another reply to the last message (the old one is kept)"),
        Binding("alt+left", "alternative(-1)", "Previous version", show=False, priority=True,
                tooltip="The previous version of the focused (else the last) message"),
        Binding("alt+right", "alternative(1)", "Next version", show=False, priority=True,
                tooltip="The next version of the focused (else the last) message"),
        # priority: the input box would take them for its own scrolling
        Binding("ctrl+pageup", "switch_session(-1)", "Previous chat", show=False,
                priority=True, tooltip="Switch to the session above"),
        Binding("ctrl+pagedown", "switch_session(1)", "Next chat", show=False,
                priority=True, tooltip="Switch to the session below")]

    def __init__(self, store: Store, load_engine: Callable[[], LLMEngine], model_name: str, *,
                 context_window: int = DEFAULT_CONTEXT_WINDOW, raw: bool = False,
                 session_id: int | None = None, continue_last: bool = False,
                 settings: SamplingSettings | None = None,
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 load_model: Callable[[str | None], LLMEngine] | None = None) -> None:
        """``settings`` and ``system_prompt`` are those of new sessions; ``load_model``
        makes the engine of another model for ``/model`` (None: the app cannot switch)."""
        super().__init__()
        self.store, self.model_name = store, model_name
        self.load_model = load_model
        self.new_settings = settings or SamplingSettings()
        self.new_system_prompt = system_prompt
        self.driver = EngineDriver(load_engine, lambda event: self.post_message(EngineEvent(event)))
        self.replies = Replies(self, self.driver, context_window, raw)
        self.sessions: dict[int, Session] = {}
        self.current: int | None = None
        self.engine_stopped = False
        self._start_session, self._continue_last = session_id, continue_last
        self._loaded: set[int] = set()  # sessions whose messages are read
        self.editing: Message | None = None  # the user message the input is an edit of
        self._load_started = time.monotonic()

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
        self.save(self.store.mark_interrupted)
        try:
            self.sessions = {s.id: s for s in self.store.list_sessions()}
        except StoreError as error:
            self.notify(str(error), title="Could not read the sessions", severity="error")
        await self.open_session(self._first_session())

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
        if not self.save(lambda: self.store.create_session(session), "Could not create a session"):
            return None
        self.sessions[session.id] = session
        return session.id

    def on_unmount(self) -> None:
        self.replies.interrupt_all()
        self.engine_stopped = self.driver.stop(timeout=2.0)
        self.store.close()

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
        self.show_sessions()
        self.show_inspector_focus()
        self.remember_inputs()
        if self.editing is not None and self.editing not in session.messages:
            self.stop_editing()
        self.focus_input()

    def focus_input(self) -> None:
        """Typing goes to the input again (after a switch, a dialog, a copy)."""
        self.query_one(PromptInput).focus()

    def remember_inputs(self) -> None:
        """The focused session's messages are what Up and Down recall in the input."""
        if self.session is not None:
            self.query_one(PromptInput).remember(
                [m.content for m in self.session.messages if m.role == "user"])

    def switch_model(self, spec: str | None, name: str) -> None:
        """Load model ``spec`` (a name, a path, None: the default) in the engine's thread;
        replies sent meanwhile wait for it. The sessions, the store's, keep their history."""
        self.model_name = name
        self.replies.engine_ready = False
        self.query_one(StatusLine).show_loading(name, time.monotonic())
        self.driver.switch(partial(self.load_model, spec))

    def on_message_box_copied(self) -> None:
        self.focus_input()

    def on_message_box_edit_asked(self, event: MessageBox.EditAsked) -> None:
        self.edit(event.message)

    def edit(self, message: Message) -> None:
        """Put ``message`` in the input: Enter sends it as a new branch, Esc leaves it."""
        box = self.query_one(PromptInput)
        box.load_text(message.content)
        box.move_cursor(box.document.end)
        box.border_title = "editing: Enter sends a new branch · Esc leaves the edit"
        self.editing = message
        self.focus_input()

    def stop_editing(self) -> None:
        box = self.query_one(PromptInput)
        box.border_title = None
        if self.editing is not None:
            box.clear()
        self.editing = None

    async def action_regenerate(self) -> None:
        if self.session is not None:
            await self.replies.regenerate(self.session)

    async def action_alternative(self, step: int) -> None:
        """Step through the focused (else the last) message's versions: replies or edits."""
        session = self.session
        if session is None or not session.messages:
            return
        if self.replies.reply_of(session.id) is not None:
            self.notify("This session is still answering", severity="warning")
            return
        focused = self.focused.message if isinstance(self.focused, MessageBox) else None
        message = focused or session.messages[-1]
        versions = self.store.alternatives(message)
        place = versions.index(message.id) + step
        if not 0 <= place < len(versions):
            return
        self.save(lambda: self.store.switch_to(session, versions[place]))
        await self.view(session.id).show_messages()
        self.remember_inputs()
        self.show_inspector_focus()

    def show_sessions(self) -> None:
        self.query_one(SessionList).show(self._ordered(), self.current,
                                         self.replies.busy_sessions())

    def view(self, session_id: int) -> ChatView | None:
        """The chat view of ``session_id`` (None before the session is first opened)."""
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

    def action_rename_session(self) -> None:
        if self.session is not None:
            self.push_screen(RenameScreen(self.session.title), self.rename)

    def rename(self, title: str | None) -> None:
        """Rename the focused session (None or empty: leave it as it is)."""
        self.focus_input()
        session = self.session
        if title and session is not None:
            session.title = self.sub_title = title
            self.save(lambda: self.store.save_session(session))
            self.show_sessions()
            self.show_inspector_focus()

    def action_delete_session(self) -> None:
        if (session := self.session) is None:
            return
        count = len(self._messages(session))
        question = f"Delete the session “{session.title}” and its {count} messages?"
        self.push_screen(ConfirmScreen(question, yes="Delete"),
                         lambda yes: self._delete(session) if yes else self.focus_input())

    async def _delete(self, session: Session) -> None:
        if not self.save(lambda: self.store.delete_session(session.id), "Could not delete"):
            return
        self.replies.drop(session)
        del self.sessions[session.id]
        if (view := self.view(session.id)) is not None:
            await view.remove()
        ordered = self._ordered()
        await self.open_session(ordered[0].id if ordered else self._create_session())
        self.notify(f"Deleted “{session.title}”")

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        """A slash command, or a message (an edit's new branch while editing) for the focused
        session; the input is cleared only once it went through."""
        if (command := parse(event.text)) is not None:
            done = await run_slash(self, *command)
        elif self.session is None:
            self.notify("No session is open", severity="error")
            done = False
        else:
            done = await self.replies.send(self.session, event.text, instead_of=self.editing)
            if done and self.editing is not None:
                self.stop_editing()
        if done:
            event.prompt_input.clear()
            self.remember_inputs()

    def action_cancel_reply(self) -> None:
        """Leave an edit, else stop the focused session's reply (blocks freed, text kept)."""
        if self.editing is not None:
            self.stop_editing()
            return
        if self.replies.cancel(self.current):
            self.notify("Reply cancelled")

    def on_engine_event(self, message: EngineEvent) -> None:
        if self.is_running:  # else shutting down: the widgets are being removed
            self.replies.take(message.event)

    def show_inspector_focus(self) -> None:
        titles = {sid: session.title for sid, session in self.sessions.items()}
        self.query_one(Inspector).show_focus(self.replies.session_of, titles, self.current,
                                             self.replies.paths)

    def save(self, write: Callable[[], object], failed: str = "Could not save") -> bool:
        """Run a store write; on failure show it (titled ``failed``) and return False, data kept."""
        try:
            write()
        except StoreError as error:
            self.notify(str(error), title=failed, severity="error", timeout=8)
            return False
        return True

    def action_toggle_inspector(self) -> None:
        self.screen.toggle_class("-inspecting")
        self.show_inspector_focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.BINDINGS))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from (SystemCommand(*command) for command in (
            ("New chat", "Start a new session", self.action_new_session),
            ("Rename chat", "Rename the focused session", self.action_rename_session),
            ("Delete chat", "Delete the focused session (asks first)", self.action_delete_session),
            ("Clear chat", "Forget the focused session's messages",
             lambda: run_slash(self, "clear", "")),
            ("Export chat", "Write the focused session as Markdown and JSON",
             lambda: run_slash(self, "export", "")),
            ("Toggle inspector", "Show or hide the KV cache inspector",
             self.action_toggle_inspector),
            ("Cancel reply", "Stop the focused session's reply", self.action_cancel_reply),
            ("Help", "Keys and slash commands", self.action_help)))
