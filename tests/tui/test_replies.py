"""Sending, streaming, several sessions at once, cancelling, waiting for the model, and
history beyond the context window dropping off, oldest first."""

from __future__ import annotations

import threading
from functools import partial

import pytest
from textual import events
from textual.widgets import Markdown

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.driver import load_engine
from pagedchat.chat.store import Store
from pagedchat.tui.widgets.inspector import Inspector
from pagedchat.tui.widgets.message_box import MessageBox
from tests.tui.conftest import ready, replies_done, say, wait_until

# STORY says one sentence again and again: the repetition guard would stop it
LONG = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=64, seed=0, loop_guard=False)
STORY = "Once upon a time a block table met a pool of blocks. " * 20


async def type_while_streaming(pilot, engine, text: str, replies: list) -> None:
    """Type ``text`` key by key with an engine step between keys: every key shows in the
    input while the engine's thread keeps producing tokens (it never holds the UI)."""
    box = pilot.app.query_one("#input")
    for char in text:
        before, counts = box.text, [reply.output_tokens for reply in replies]
        engine.allow(1)
        box.post_message(events.Key(char, char))
        await wait_until(pilot, lambda before=before: box.text != before)
        await wait_until(pilot, lambda counts=counts: any(
            reply.output_tokens > count for reply, count in zip(replies, counts, strict=True)))
    assert box.text.endswith(text)
    assert all(reply.status == "generating" for reply in replies)


def last_box(app) -> MessageBox:
    return app.query(MessageBox).last()


async def test_message_gets_a_streamed_reply(make_app, fake_engine):
    fake_engine.answer_with(STORY)
    fake_engine.hold()
    app = make_app(settings=LONG)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "Tell me a story")
        reply = app.session.messages[-1]
        assert app.query_one("#input").text == ""
        assert [m.role for m in app.session.messages] == ["user", "assistant"]
        fake_engine.allow(10)
        markdown = last_box(app).query_one(Markdown)
        await wait_until(pilot, lambda: reply.output_tokens == 10
                         and markdown.source == reply.content)
        assert reply.status == "generating" and STORY.startswith(reply.content)
        fake_engine.allow()
        await wait_until(pilot, lambda: reply.status != "generating")
        await pilot.pause(0.2)
        assert reply.status == "done" and reply.output_tokens == 64
        assert reply.content == fake_engine.tokenizer.decode(fake_engine.reply_ids[:64])
        assert last_box(app).query_one(Markdown).source == reply.content
        assert reply.prompt_tokens > 0
        stored = app.store.load_session(app.current).messages
        assert [(m.role, m.status) for m in stored] == [("user", "done"), ("assistant", "done")]
        assert stored[1].content == reply.content


async def test_two_sessions_answer_at_the_same_time(make_app, fake_engine):
    fake_engine.answer_with(STORY)
    fake_engine.hold()
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=1000))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "first question")
        first_session, first = app.current, app.session.messages[-1]
        await pilot.press("ctrl+n")
        await say(pilot, "second question")
        second = app.session.messages[-1]
        inspector = app.query_one(Inspector)
        fake_engine.allow(1)
        await wait_until(pilot, lambda: inspector.latest.stats.num_running == 2)
        await type_while_streaming(pilot, fake_engine, "still typing", [first, second])
        tokens = first.output_tokens, second.output_tokens
        fake_engine.allow(1)
        await wait_until(pilot, lambda: first.output_tokens > tokens[0]
                         and second.output_tokens > tokens[1])
        assert first.status == second.status == "generating" and len(app.replies.turns) == 2
        await pilot.press("escape")
        await app.open_session(first_session)
        assert last_box(app).query_one(Markdown).source  # streamed while in the background
        await pilot.press("escape")
        assert {first.status, second.status} <= {"cancelled", "done"} and not app.replies.turns


async def test_escape_cancels_the_reply_keeps_its_text_and_frees_its_blocks(make_app):
    app = make_app(settings=SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=1500, seed=1),
                   engine="tiny", step_delay=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "go on forever")
        reply = app.session.messages[-1]
        await wait_until(pilot, lambda: reply.output_tokens > 5)
        await pilot.press("escape")
        assert reply.status == "cancelled" and not app.replies.turns
        kept = reply.content
        assert kept
        inspector = app.query_one(Inspector)
        await wait_until(pilot, lambda: inspector.latest.stats.num_running == 0
                         and inspector.latest.stats.used_blocks == 0)
        await pilot.pause(0.3)
        assert reply.content == kept  # later outputs of the aborted request are ignored
        assert "cancelled" in str(last_box(app).query_one(".header").content)
        stored = app.store.load_session(app.current).messages[-1]
        assert (stored.status, stored.content) == ("cancelled", kept)


async def test_first_message_waits_for_the_model(make_app, fake_engine):
    gate = threading.Event()

    def slow_load():
        gate.wait(30)
        return fake_engine

    app = make_app()
    app.driver._load = slow_load
    async with app.run_test(size=(100, 30)) as pilot:
        assert "loading tiny-llama" in str(app.query_one("#model-state").content)
        await say(pilot, "are you there?")
        assert app.store.load_session(app.current).messages[0].content == "are you there?"
        assert "waiting for the model" in str(last_box(app).query_one(".header").content)
        gate.set()
        await replies_done(pilot)
        assert app.session.messages[-1].status == "done"
        assert "waiting" not in str(last_box(app).query_one(".header").content)
        assert str(app.query_one("#model-state").content).startswith("● tiny-llama")


async def test_old_messages_drop_off_at_the_context_window(make_app, tmp_path):
    store = Store(tmp_path / "chats.db")
    session = store.create_session(
        Session(title="Long", settings=SamplingSettings(temperature=0.0, max_tokens=4)))
    for i in range(0, 6, 2):
        store.add_turn(session, Message("user", f"message {i} " + "word " * 30),
                       Message("assistant", f"message {i + 1} " + "word " * 30))
    store.close()
    app = make_app(context_window=128, continue_last=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "the newest question")
        await replies_done(pilot)
        reply = app.session.messages[-1]
        assert reply.status == "done"
        assert reply.prompt_tokens <= 128
        assert 0 < reply.dropped_messages < 7
        caption = str(app.query(".caption").last().content)
        assert f"{reply.dropped_messages} older messages dropped" in caption
        stored = app.store.load_messages(app.current)[-1]
        assert stored.dropped_messages == reply.dropped_messages


@pytest.mark.slow
async def test_real_model_answers(tmp_path, shared_model_loads):
    from pagedchat.tui.app import ChatApp

    app = ChatApp(Store(tmp_path / "c.db"), partial(load_engine, None, num_kv_blocks=128),
                  "SmolLM2-135M-Instruct",
                  settings=SamplingSettings(temperature=0.0, max_tokens=12))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.replies.engine_ready, timeout=300)
        await say(pilot, "What is the capital of France?")
        await wait_until(pilot, lambda: not app.replies.turns, timeout=300)
        reply = app.session.messages[-1]
        assert reply.status == "done"
        assert "Paris" in reply.content


async def test_a_looping_reply_is_stopped_and_says_so(make_app, fake_engine):
    fake_engine.answer_with("I will say this again. " * 30)
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=400))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "tell me something")
        reply = app.session.messages[-1]
        await replies_done(pilot)
        assert reply.status == "looped" and reply.output_tokens < 100
        caption = str(last_box(app).query_one(".caption").content)
        assert "repeating itself" in caption
        stored = app.store.load_session(app.current).messages[-1]
        assert (stored.status, stored.content) == ("looped", reply.content)
        await say(pilot, "/set loop_guard off")
        assert app.session.settings.loop_guard is False
