"""History beyond the context window drops off, oldest first, and the app says so."""

from __future__ import annotations

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.store import Store
from tests.tui.conftest import ready, replies_done, say


async def test_old_messages_drop_off_at_the_context_window(make_app, tmp_path):
    store = Store(tmp_path / "chats.db")
    session = store.create_session(
        Session(title="Long", settings=SamplingSettings(temperature=0.0, max_tokens=4)))
    for i in range(6):
        role = "user" if i % 2 == 0 else "assistant"
        store.add_message(session, Message(role, f"message {i} " + "word " * 30))
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
