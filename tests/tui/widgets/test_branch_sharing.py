"""The inspector names the branches of a conversation whose blocks a reply shares: a
regenerated reply takes its prompt's blocks from the earlier versions, an edit the blocks of
the history before the edited message."""

from __future__ import annotations

from pagedchat.chat.conversation import Message, SamplingSettings
from pagedchat.engine.outputs import BlockEntry, SeqBlockTable
from pagedchat.tui.widgets.branch_sharing import BranchBlocks, branch_lines, fork_label
from pagedchat.tui.widgets.inspector import Inspector
from pagedchat.tui.widgets.message_box import MessageBox
from pagedchat.tui.widgets.prompt_input import PromptInput
from tests.tui.conftest import ready, replies_done, say, wait_until


def table(rid: str, physical: list[int]) -> SeqBlockTable:
    return SeqBlockTable(rid, 0, [BlockEntry(i, p, 16, 1, True, False)
                                  for i, p in enumerate(physical)])


def message(id: int, role: str, branch: tuple[int, int] = (1, 1)) -> Message:
    return Message(role, "", id=id, branch=branch)


def test_blocks_are_shared_from_the_first_one_within_the_prefix_hit():
    branches = BranchBlocks()
    branches.record([table("a", [4, 5, 6, 7]), table("b", [4, 5, 9, 7])])
    assert branches.shared("b", "a", hit_blocks=4) == 2  # a run from the first block
    assert branches.shared("b", "a", hit_blocks=1) == 1  # only what the cache gave
    assert branches.shared("b", "unknown", hit_blocks=4) == 0
    user, first, second = message(1, "user"), message(2, "assistant"), message(3, "assistant",
                                                                                 (2, 2))
    assert fork_label([user, second], [user, first]) == "reply 1/2"
    edited = message(4, "user", (2, 2))
    assert fork_label([edited, message(5, "assistant")], [user, first]) == \
        "message 1, version 1/2"
    assert fork_label([user, first, message(6, "user"), message(7, "assistant")],
                      [user, first]) == "the turn at message 2"
    second.cached_tokens = 64
    assert branch_lines(branches, ["b"], {"a": [user, first], "b": [user, second]}, 16) == \
        ["2 blocks shared with reply 1/2"]


async def test_inspector_names_the_branches_sharing_a_replys_blocks(make_app):
    app = make_app(settings=SamplingSettings(temperature=0.0, max_tokens=1000),
                   engine="tiny", step_delay=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f3")
        inspector = app.query_one(Inspector)

        def sharing() -> str:
            return str(inspector.query_one("#sharing").content)

        await say(pilot, "What is a block?")
        first = app.session.messages[-1]
        await wait_until(pilot, lambda: first.output_tokens >= 2)
        await pilot.press("escape")
        await replies_done(pilot)
        await pilot.press("ctrl+r")  # another version: its prompt's blocks are the first's
        second = app.session.messages[-1]
        await wait_until(pilot, lambda: "shared with reply 1/2" in sharing())
        assert second.cached_tokens >= 32 and second is not first
        await pilot.press("escape")
        await replies_done(pilot)

        list(app.view(app.current).query(MessageBox))[0].focus()
        await pilot.press("e")  # edit the question: a branch sharing the system prompt
        app.query_one(PromptInput).clear()
        await say(pilot, "What is a page?")
        await wait_until(pilot, lambda: "message 1, version 1/2" in sharing())
        # both versions of the old reply are of that branch: it is named once
        assert sharing().count("message 1, version 1/2") == 1
        await pilot.press("escape")
        await replies_done(pilot)
