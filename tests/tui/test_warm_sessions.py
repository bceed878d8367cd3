"""A session reopened in a new app (a restart, `chat -c`) starts warm: its blocks come back
from the KV store, and its first reply's prompt is taken from the cache."""

from __future__ import annotations

from functools import partial

from pagedchat.chat.driver import load_engine
from pagedchat.tui.widgets.inspector import Inspector
from tests.tui.conftest import ready, replies_done, say


async def test_a_reopened_session_reads_its_blocks_back(make_app, tmp_path):
    load_model = partial(load_engine, num_kv_blocks=64, kv_store=str(tmp_path / "kv"))
    first = make_app(engine="tiny", load_model=load_model)
    async with first.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await say(pilot, "Tell me about paging in operating systems.")
        await replies_done(pilot)
    assert list((tmp_path / "kv").glob("*/*.kv"))

    again = make_app(engine="tiny", load_model=load_model, continue_last=True)
    async with again.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert len(again.session.messages) == 2  # the same session, reopened
        await say(pilot, "And segmentation?")
        await replies_done(pilot)
        reply = again.session.messages[-1]
        # a fresh pool caches nothing: these came from disk
        assert reply.status == "done" and reply.cached_tokens >= 32
        counts = str(again.query_one(Inspector).query_one("#counts").content)
        assert f"disk    {reply.cached_tokens // 16} blocks read back" in counts
