"""Switching, creating, renaming, deleting sessions, and finding them again after a restart."""

from __future__ import annotations

from textual.widgets import ContentSwitcher

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.store import Store
from pagedchat.tui.screens.confirm import ConfirmScreen, RenameScreen
from pagedchat.tui.widgets.chat_view import ChatView
from pagedchat.tui.widgets.message_box import MessageBox
from pagedchat.tui.widgets.prompt_input import PromptInput
from pagedchat.tui.widgets.session_list import SessionList
from tests.tui.conftest import ready, replies_done, say, wait_until


def seed_store(path, *conversations: tuple[str, list[str]]) -> list[int]:
    """Sessions of question/answer turns, the first listed most recent."""
    store = Store(path)
    ids = []
    for title, texts in reversed(conversations):
        session = store.create_session(Session(title=title))
        for question, answer in zip(texts[::2], texts[1::2], strict=True):
            store.add_turn(session, Message("user", question), Message("assistant", answer))
        ids.append(session.id)
    store.close()
    return ids[::-1]


def shown_texts(app) -> list[str]:
    view = app.query_one(ContentSwitcher).visible_content
    return [box.message.content for box in view.query(MessageBox)]


async def test_switching_sessions(make_app, tmp_path):
    cooking, travel = seed_store(tmp_path / "chats.db",
                                 ("Cooking", ["how long for an egg?", "7 minutes"]),
                                 ("Travel", ["best time for Oslo?", "June"]))
    app = make_app(continue_last=True, engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.current == cooking and app.sub_title == "Cooking"
        assert shown_texts(app) == ["how long for an egg?", "7 minutes"]
        await pilot.press("ctrl+pagedown")
        assert app.current == travel
        assert shown_texts(app) == ["best time for Oslo?", "June"]
        await pilot.press("ctrl+pageup")
        assert app.current == cooking
        sessions = app.query_one(SessionList)
        sessions.focus()
        sessions.highlighted = 1
        await pilot.press("enter")
        assert app.current == travel and app.sub_title == "Travel"
        assert len(app.query(ChatView)) == 2  # each view is made once and kept


async def test_new_rename_delete(make_app):
    app = make_app(engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        first = app.current
        await pilot.press("ctrl+n")
        second = app.current
        assert second != first and set(app.sessions) == {first, second}
        await pilot.press("f2")
        assert isinstance(app.screen, RenameScreen)
        await pilot.press("ctrl+u", *"Plans", "enter")
        assert app.session.title == "Plans"
        assert app.store.load_session(second).title == "Plans"
        await pilot.press("f8")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert second in app.sessions
        await pilot.press("f8")
        await pilot.press("y")
        await wait_until(pilot, lambda: second not in app.sessions)
        assert app.store.load_session(second) is None
        assert app.current == first


async def test_sessions_and_messages_survive_a_restart(make_app, fake_engine):
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=6))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "remember me")
        await replies_done(pilot)
        kept = app.session.id, app.session.messages[-1].content
        await pilot.press("ctrl+n")
        await say(pilot, "/set max_tokens 2000")
        fake_engine.hold()  # the long reply cannot finish before the app quits
        await say(pilot, "cut me short")
        fake_engine.allow(2)
        await wait_until(pilot, lambda: app.session.messages[-1].output_tokens > 0)
        interrupted = app.session.id
    # quitting mid-reply keeps the text so far, marked interrupted

    app = make_app(continue_last=True, engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.current == interrupted
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        assert app.session.messages[-1].status == "interrupted"
        assert app.session.settings.max_tokens == 2000
        assert "interrupted" in str(app.query(MessageBox).last().query_one(".header").content)
        await app.open_session(kept[0])
        assert shown_texts(app) == ["remember me", kept[1]]
        assert app.session.title == "remember me"

    app = make_app(session_id=kept[0], engine=False)
    async with app.run_test(size=(100, 30)):
        assert app.current == kept[0]


async def test_keys_work_from_the_input_and_focus_comes_back_to_it(make_app, tmp_path):
    cooking, travel = seed_store(tmp_path / "chats.db",
                                 ("Cooking", ["how long for an egg?", "7 minutes",
                                              "and for two?", "the same"]),
                                 ("Travel", ["best time for Oslo?", "June"]))
    app = make_app(continue_last=True, engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        box = app.query_one(PromptInput)
        assert app.focused is box
        await pilot.press(*"first", "ctrl+j", *"second")
        assert box.text == "first\nsecond"  # Ctrl+J: a new line, nothing sent
        box.clear()
        await pilot.press("up")  # earlier inputs of this session, newest first
        assert box.text == "and for two?"
        await pilot.press("up")
        assert box.text == "how long for an egg?"
        await pilot.press("up")  # no older one: stays
        assert box.text == "how long for an egg?"
        await pilot.press("down", "down")
        assert box.text == ""  # past the newest: the draft again
        await pilot.press("ctrl+pagedown")  # from the input itself
        assert app.current == travel and app.focused is box
        await pilot.press("up")
        assert box.text == "best time for Oslo?"
        box.clear()
        app.query(MessageBox).first().focus()
        await pilot.press("ctrl+pageup")
        assert app.current == cooking and app.focused is box
        await pilot.press("f2")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, RenameScreen))
        assert app.focused is box
        await pilot.press("f8", "n")
        assert app.focused is box
        await pilot.press("f8", "y")
        await wait_until(pilot, lambda: cooking not in app.sessions)
        assert app.current == travel and app.focused is box
