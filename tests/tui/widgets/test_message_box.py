"""Messages can be copied whole, or their code blocks; focus goes back to the input; a
reply's single line breaks are kept."""

from __future__ import annotations

from pagedchat.chat.conversation import Message, Session
from pagedchat.chat.store import Store
from pagedchat.tui.widgets.message_box import MessageBox, code_blocks, with_line_breaks
from pagedchat.tui.widgets.prompt_input import PromptInput

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
