"""Failures show as notifications; the app goes on and keeps what the user typed."""

from __future__ import annotations

from pagedchat.chat.store import StoreError
from tests.tui.conftest import say, wait_until


def record_notifications(app) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    notify = app.notify

    def spy(message, *, title="", severity="information", **kwargs):
        seen.append((severity, f"{title}: {message}"))
        notify(message, title=title, severity=severity, **kwargs)

    app.notify = spy
    return seen


async def test_model_that_fails_to_load(make_app, tmp_path):
    app = make_app(engine="tiny", model=str(tmp_path / "missing-model"))
    seen = record_notifications(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: "failed" in str(app.query_one("#model-state").content))
        assert any(s == "error" and "missing-model: no such file" in m for s, m in seen)
        await say(pilot, "hello?")
        reply = app.session.messages[-1]
        await wait_until(pilot, lambda: reply.status == "error")
        assert "failed to load" in reply.error
        stored = app.store.load_messages(app.current)
        assert [m.content for m in stored][0] == "hello?" and stored[1].status == "error"


async def test_message_that_cannot_be_saved_stays_in_the_input(make_app):
    app = make_app(engine=False)
    seen = record_notifications(app)
    async with app.run_test(size=(100, 30)) as pilot:
        def disk_full(*args):
            raise StoreError("chats.db: database or disk is full")

        app.store.add_turn = disk_full
        await say(pilot, "an important thought")
        assert app.query_one("#input").text == "an important thought"
        assert app.session.messages == []
        assert any(s == "error" and "disk is full" in m for s, m in seen)


async def test_prompt_that_cannot_fit(make_app):
    app = make_app(context_window=16)
    seen = record_notifications(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await say(pilot, "hi")
        reply = app.session.messages[-1]
        await wait_until(pilot, lambda: reply.status == "error")
        assert "context window of 16" in reply.error
        assert any(s == "error" and "context window of 16" in m for s, m in seen)
        assert "failed" in str(app.query(".header").last().content)
