"""Snapshots of the main screen, the inspector and the help screen (fixed size, no blink).

The main screen runs the fake engine (nothing generated in view); the
inspector is fed fixed engine snapshots through the app's own message path, so its
figures and sparklines do not depend on timing.
"""

from __future__ import annotations

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.driver import EngineReady, StatsUpdate
from pagedchat.chat.store import Store
from pagedchat.engine.outputs import BlockEntry, EngineStats, SeqBlockTable
from pagedchat.tui.replies import EngineEvent
from tests.tui.conftest import ready, wait_until

ANSWER = """\
Use a list comprehension:

```python
squares = [n * n for n in range(10)]
```

It reads as *"n squared, for each n"*."""


def seed(path) -> None:
    store = Store(path)
    settings = SamplingSettings(temperature=0.0, max_tokens=8, seed=0)
    store.create_session(Session(title="Trip to Oslo", settings=settings))
    session = store.create_session(Session(title="Python squares", settings=settings))
    store.add_turn(session, Message("user", "How do I square the numbers 0 to 9?"),
                   Message("assistant", ANSWER, prompt_tokens=67, cached_tokens=48,
                           output_tokens=41))
    store.close()


def still(pilot) -> None:
    pilot.app.query_one("#input").cursor_blink = False


def stats(step: int) -> StatsUpdate:
    """Two live sessions (requests s1-r1 and s2-r2) sharing three system-prompt blocks."""
    shared = [BlockEntry(i, i, 16, 2, True, True) for i in range(3)]
    first = shared + [BlockEntry(3, 3, 16, 1, True, False), BlockEntry(4, 5, 7 + step, 1,
                                                                       False, False)]
    second = shared + [BlockEntry(3, 4, 11 + step, 1, False, False)]
    pool = ["shared"] * 3 + ["used"] * 3 + ["cached"] * 4 + ["free"] * 54
    owners = {i: ["s1-r1", "s2-r2"] for i in range(3)} | {3: ["s1-r1"], 5: ["s1-r1"],
                                                          4: ["s2-r2"]}
    live = 16 * 4 + 7 + step + 11 + step
    return StatsUpdate(EngineStats(
        total_blocks=64, block_size=16, used_blocks=6, free_blocks=54, cached_blocks=4,
        live_tokens=live, empty_slots=96 - live, utilization=live / 96,
        internal_fragmentation=(96 - live) / 96, shared_blocks=3, saved_blocks=3,
        prefix_queries=67 * (step + 1), prefix_hits=48 * step,
        prefix_hit_rate=48 * step / (67 * (step + 1)),
        preemptions=0, swapped_out=0, swapped_in=0, host_blocks_used=0, num_running=2,
        num_waiting=0, num_swapped=0,
        block_tables=[SeqBlockTable("s1-r1", 0, first), SeqBlockTable("s2-r2", 0, second)],
        pool=pool, owners=owners,
    ), tokens_per_second=20.0 + 3 * step)


def test_main_screen(snap_compare, make_app, tmp_path):
    seed(tmp_path / "chats.db")
    app = make_app(continue_last=True)

    async def run_before(pilot) -> None:
        await ready(pilot)
        await wait_until(pilot, lambda: app.query_one("#engine-load").content)
        still(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_inspector(snap_compare, make_app, tmp_path):
    seed(tmp_path / "chats.db")
    app = make_app(continue_last=True, engine=False)

    async def run_before(pilot) -> None:
        still(pilot)
        app.replies.session_of.update({"s1-r1": 1, "s2-r2": 2})
        app.post_message(EngineEvent(EngineReady(num_blocks=64, block_size=16)))
        for step in range(5):
            app.post_message(EngineEvent(stats(step)))
        await pilot.press("f3")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_help_screen(snap_compare, make_app, tmp_path):
    app = make_app(engine=False)

    async def run_before(pilot) -> None:
        still(pilot)
        app.post_message(EngineEvent(EngineReady(num_blocks=64, block_size=16)))
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
