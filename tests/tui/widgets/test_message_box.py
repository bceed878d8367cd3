"""Messages can be copied whole, or their code blocks; focus goes back to the input; a
reply's single line breaks are kept; a streaming reply costs the app's thread little."""

from __future__ import annotations

from types import SimpleNamespace

from textual.widgets import Markdown

from pagedchat.chat.conversation import Message, Session
from pagedchat.chat.store import Store
from pagedchat.tui.widgets import message_box
from pagedchat.tui.widgets.message_box import (
    MessageBox,
    MessageMarkdown,
    code_blocks,
    with_line_breaks,
)
from pagedchat.tui.widgets.prompt_input import PromptInput
from tests.tui.conftest import wait_until

REPLY = "Try this:\n\n```python\nprint('hi')\n```\n\nor this:\n\n```\necho hi\n```\n"


def test_code_blocks():
    assert code_blocks(REPLY) == ["print('hi')", "echo hi"]
    assert code_blocks("no code") == []


async def test_copy_a_message_and_its_code(make_app, tmp_path):
    store = Store(tmp_path / "chats.db")
    session = store.create_session(Session(title="Code"))
    store.add_turn(session, Message("user", "How do I greet?"), Message("assistant", REPLY))
    store.close()
    app = make_app(continue_last=True, engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        user_box, reply_box = app.query(MessageBox)
        reply_box.focus()
        await pilot.press("c")
        assert app.clipboard == "echo hi"
        assert isinstance(app.focused, PromptInput)  # typing goes on where it was
        reply_box.focus()
        await pilot.press("y")
        assert app.clipboard == REPLY
        user_box.focus()
        await pilot.press("c")
        assert app.clipboard == REPLY  # no code block: nothing copied


def test_single_line_breaks_are_kept_outside_code():
    poem = "Roses are red,\nviolets are blue.\n\n```\na\nb\n```\nend"
    assert with_line_breaks(poem) == (
        "Roses are red,  \nviolets are blue.  \n\n```\na\nb\n```\nend")
    # a streamed reply's shown text only grows: each prefix's form begins the next's
    for cut in range(len(poem)):
        shown, later = with_line_breaks(poem[:cut]), with_line_breaks(poem[: cut + 1])
        assert later.startswith(shown)


async def test_a_streamed_reply_s_last_block_alone_loses_its_margin(make_app):
    """The caption follows the last block closely, as it grows, is replaced or is followed by
    new ones; no node of a reply matches a rule on its order among its siblings
    (:last-child), which would restyle every block of it at each streamed append."""
    app = make_app(engine=False)
    async with app.run_test(size=(100, 40)) as pilot:
        # a finished reply: no flush of the box's own text between the changes below
        box = MessageBox(Message("assistant", "one", prompt_tokens=5))
        await app.screen.mount(box, before=0)
        markdown, caption = box.query_one(MessageMarkdown), box.query_one(".caption")
        # its first text goes in when it mounts, an update that an earlier append would lose
        await wait_until(pilot, lambda: len(markdown.children) == 1)

        async def blocks_after(change) -> list[tuple[int, int]]:
            await change
            await pilot.pause()
            assert caption.region.y == markdown.children[-1].region.bottom
            return [(block.styles.margin.top, block.styles.margin.bottom)
                    for block in markdown.children]

        assert await blocks_after(markdown.append(" more")) == [(0, 0)]
        assert await blocks_after(markdown.append("\n\ntwo\n\n```\ncode\n```")) == [
            (0, 1), (0, 1), (0, 0)]
        assert await blocks_after(markdown.append("\n\n# Title")) == [
            (0, 1), (0, 1), (1, 1), (0, 0)]
        assert await blocks_after(markdown.update("- a\n- b\n\nend")) == [(0, 1), (0, 0)]
        assert not any(node._has_order_style for node in box.walk_children())


async def test_a_busy_app_thread_flushes_a_streaming_reply_less_often(make_app, monkeypatch):
    """A tick flushes only where the app's thread was busy at most UI_SHARE of the time since
    the last flush (its work takes the cores the engine's kernels run on), or MOST_SECONDS ago."""
    clock = SimpleNamespace(monotonic=lambda: 0.0, thread_time=lambda: 0.0)
    monkeypatch.setattr(message_box, "time", clock)
    app = make_app(engine=False)
    async with app.run_test(size=(100, 30)):
        box = MessageBox(Message("assistant", "one"))
        await app.screen.mount(box)

        def tick(wall: float, cpu: float, more: str) -> bool:
            clock.monotonic, clock.thread_time = (lambda: wall), (lambda: cpu)
            box.message.content += more
            box._flush()
            return box.query_one(Markdown).source == box.message.content

        assert tick(100.0, 5.0, " two")  # the first
        assert not tick(100.1, 5.05, " three")  # 50 ms of CPU in 100 ms
        assert tick(100.6, 5.05, "")  # 50 ms in 600
        assert not tick(100.7, 5.95, " four")
        assert tick(100.0 + 0.6 + message_box.MOST_SECONDS, 6.0, "")
