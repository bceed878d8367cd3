"""Regenerate a reply, go between its versions, edit an earlier message into a new branch:
the old versions stay, in the store too, and every branch keeps its shared history."""

from __future__ import annotations

from pagedchat.chat.conversation import SamplingSettings
from pagedchat.tui.widgets.message_box import MessageBox
from pagedchat.tui.widgets.prompt_input import PromptInput
from tests.tui.conftest import ready, replies_done, say, wait_until


def shown(app) -> list[str]:
    view = app.view(app.current)
    return [box.message.content for box in view.query(MessageBox)]


def caption(app, index: int) -> str:
    box = list(app.view(app.current).query(MessageBox))[index]
    return str(box.query_one(".caption").content)


async def test_regenerate_browse_versions_and_edit_into_a_branch(make_app, fake_engine):
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=8))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        fake_engine.answer_with("First answer.")
        await say(pilot, "What is a block?")
        await replies_done(pilot)
        fake_engine.answer_with("Second answer.")
        await pilot.press("ctrl+r")  # from the input: another reply, the first kept
        await replies_done(pilot)
        assert shown(app) == ["What is a block?", "Second answer."]
        assert caption(app, 1).startswith("2/2")
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: shown(app)[-1] == "First answer.")
        assert caption(app, 1).startswith("1/2") and app.focused is app.query_one(PromptInput)
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: shown(app)[-1] == "Second answer.")

        fake_engine.answer_with("Third answer.")
        await say(pilot, "And a table?")
        await replies_done(pilot)
        list(app.view(app.current).query(MessageBox))[0].focus()  # the first question
        await pilot.press("e")
        box = app.query_one(PromptInput)
        assert box.text == "What is a block?" and app.editing is not None
        box.clear()
        fake_engine.answer_with("Edited answer.")
        await say(pilot, "What is a page?")
        await replies_done(pilot)
        assert shown(app) == ["What is a page?", "Edited answer."]
        assert caption(app, 0).startswith("2/2") and app.editing is None
        list(app.view(app.current).query(MessageBox))[0].focus()
        await pilot.press("alt+left")  # back to the first question, where it was left
        await wait_until(pilot, lambda: shown(app)[0] == "What is a block?")
        assert shown(app) == ["What is a block?", "Second answer.", "And a table?",
                              "Third answer."]
        stored = app.store.load_messages(app.current)
        assert [m.content for m in stored] == shown(app)  # the branch shown is the one kept


async def test_edit_is_left_with_escape_and_regenerate_needs_a_reply(make_app, fake_engine):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+r")
        assert app.session.messages == []  # nothing to regenerate: nothing happened
        await say(pilot, "hello")
        await replies_done(pilot)
        await say(pilot, "/edit")
        box = app.query_one(PromptInput)
        assert box.text == "hello" and app.editing is not None
        await pilot.press("escape")
        assert app.editing is None and box.text == ""
        assert [m.role for m in app.session.messages] == ["user", "assistant"]


async def test_a_reply_cut_short_goes_on_in_the_same_message(make_app, fake_engine):
    fake_engine.answer_with("one two three four five six seven eight nine ten")
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=3))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "count to ten")
        await replies_done(pilot)
        reply = app.session.messages[-1]
        before, tokens = reply.content, reply.output_tokens
        assert tokens == 3
        await say(pilot, "/continue")
        await replies_done(pilot)
        assert app.session.messages[-1] is reply and len(app.session.messages) == 2
        assert reply.content.startswith(before) and len(reply.content) > len(before)
        assert reply.output_tokens == 2 * tokens and reply.status == "done"
        stored = app.store.load_messages(app.current)[-1]
        assert (stored.content, stored.output_tokens) == (reply.content, reply.output_tokens)
        await wait_until(pilot, lambda: list(app.view(app.current).query(MessageBox))[-1]
                         .query_one("Markdown").source.startswith(before))
