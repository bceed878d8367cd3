"""The inspector: the focused session's blocks, blocks shared across sessions, cache reuse.

These run the tiny Llama: prefix sharing and cache reuse are the engine's own."""

from __future__ import annotations

from pagedchat.chat.conversation import SamplingSettings
from pagedchat.tui.widgets.inspector import BlockTable, Inspector
from tests.tui.conftest import ready, replies_done, say, wait_until


def rows(table: BlockTable) -> list[list]:
    return [table.get_row_at(i) for i in range(table.row_count)]


async def test_inspector_shows_blocks_shared_by_two_sessions(make_app):
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=1000),
                   engine="tiny", step_delay=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        inspector = app.query_one(Inspector)
        assert not inspector.display
        await pilot.press("f3")
        assert inspector.display
        await say(pilot, "/rename Alpha")
        await say(pilot, "first question")
        alpha = app.current
        await pilot.press("ctrl+n")
        await say(pilot, "/rename Beta")
        await say(pilot, "second question")
        beta_reply = app.session.messages[-1]

        def both_live() -> bool:
            stats = inspector.latest.stats
            return len({app.replies.session_of[t.request_id] for t in stats.block_tables}) == 2

        await wait_until(pilot, both_live)
        await pilot.pause(0.1)
        table = rows(inspector.query_one(BlockTable))
        # The system prompt fills the first blocks of both prompts: the same physical
        # blocks, two references, marked shared by both sessions.
        assert table[0][0] == 0 and table[0][3] == 2 and "shared" in table[0][4]
        assert "blocks shared with: Alpha" in str(inspector.query_one("#sharing").content)
        assert "live" in str(inspector.query_one("#table-title").content)
        stats = inspector.latest.stats
        assert stats.shared_blocks >= 2 and "shared" in stats.pool
        session_of = app.replies.session_of
        beta_tables = [t for t in stats.block_tables if session_of[t.request_id] != alpha]
        alpha_tables = [t for t in stats.block_tables if session_of[t.request_id] == alpha]
        assert beta_tables[0].blocks[0].physical == alpha_tables[0].blocks[0].physical
        await wait_until(pilot, lambda: beta_reply.cached_tokens >= 32)

        await pilot.press("escape")
        await app.open_session(alpha)
        await pilot.press("escape")
        assert not app.replies.turns
        await wait_until(pilot, lambda: inspector.latest.stats.num_running == 0)
        await pilot.pause(0.1)
        assert "last seen" in str(inspector.query_one("#table-title").content)
        assert rows(inspector.query_one(BlockTable))  # the finished reply's blocks stay shown
        await pilot.press("f3")
        assert not inspector.display


async def test_next_turn_reuses_the_cached_blocks_of_the_last(make_app):
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=8), engine="tiny")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "a first question that is long enough to fill a block or two")
        await replies_done(pilot)
        first = app.session.messages[-1]
        await say(pilot, "and a second one")
        await replies_done(pilot)
        second = app.session.messages[-1]
        assert second.prompt_tokens > first.prompt_tokens
        assert second.cached_tokens >= 16 * (first.prompt_tokens // 16)
        caption = str(app.query(".caption").last().content)
        assert f"{second.cached_tokens} cached" in caption
