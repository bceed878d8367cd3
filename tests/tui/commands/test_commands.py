"""Slash commands, the help screen and the command palette's commands."""

from __future__ import annotations

import json

from markdown_it import MarkdownIt

from pagedchat.chat.conversation import Message
from pagedchat.tui.commands import COMMANDS, parse
from pagedchat.tui.screens.confirm import ConfirmScreen
from pagedchat.tui.screens.help import HelpScreen, help_markdown
from pagedchat.tui.widgets.prompt_input import PromptInput
from tests.tui.conftest import say, wait_until


def test_parse():
    assert parse("/set top_k 5") == ("set", "top_k 5")
    assert parse("/HELP") == ("help", "")
    assert parse("hello") is None
    assert parse("//not a command") is None


def table_rows(markdown: str) -> list[list[str]]:
    """The cells' text of every table row, as the help's Markdown widget parses them."""
    rows, row = [], None
    for token in MarkdownIt("gfm-like").parse(markdown):
        if token.type == "tr_open":
            row = []
        elif token.type == "tr_close":
            rows.append(row)
            row = None
        elif token.type == "inline" and row is not None:
            row.append("".join(child.content for child in token.children))
    return rows


def test_help_lists_every_command_from_its_one_table_one_row_each():
    assert list(COMMANDS) == ["new", "system", "set", "model", "regen", "edit", "continue", "clear",
                              "rename", "export", "help"]
    rows = table_rows(help_markdown([]))
    assert all([found.usage, found.help] in rows for found in COMMANDS.values())
    assert ["/model [NAME|PATH]", "switch the model (alone: list the models)"] in rows
    assert all(len(row) == 2 for row in rows)


async def test_slash_commands(make_app, tmp_path):
    app = make_app(engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        box = app.query_one("#input")
        first = app.current
        await say(pilot, "/set temperature 0.3")
        await say(pilot, "/set max_tokens 256")
        assert (app.session.settings.temperature, app.session.settings.max_tokens) == (0.3, 256)
        assert app.store.load_session(first).settings.max_tokens == 256
        assert box.text == ""

        await say(pilot, "/set temperature hot")  # refused: the text stays to be fixed
        assert box.text == "/set temperature hot" and app.session.settings.temperature == 0.3
        box.clear()
        await say(pilot, "/frobnicate")
        assert box.text == "/frobnicate"
        box.clear()

        await say(pilot, "/system You answer in French.")
        assert app.store.load_session(first).system_prompt == "You answer in French."
        await say(pilot, "/rename Holidays")
        assert app.store.load_session(first).title == "Holidays" == app.sub_title

        turn = [Message("user", "bonjour"), Message("assistant", "salut")]
        app.store.add_turn(app.session, *turn)
        app.session.messages += turn
        await say(pilot, f"/export {tmp_path / 'out' / 'holidays.md'}")
        assert (tmp_path / "out" / "holidays.md").read_text().startswith("# Holidays")
        data = json.loads((tmp_path / "out" / "holidays.json").read_text())
        assert data["system_prompt"] == "You answer in French."
        assert data["messages"][0]["content"] == "bonjour"

        await say(pilot, "/clear")  # asks first: "n" keeps them, "y" clears
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert len(app.session.messages) == 2 and isinstance(app.focused, PromptInput)
        await say(pilot, "/clear")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.session.messages == [])
        assert app.store.load_messages(first) == [] and isinstance(app.focused, PromptInput)

        await say(pilot, "/new Second")
        assert app.current != first and app.session.title == "Second"

        await say(pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert not isinstance(app.screen, HelpScreen)


async def test_command_palette_has_the_app_commands(make_app):
    app = make_app(engine=False)
    async with app.run_test(size=(100, 30)):
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {"New chat", "Rename chat", "Delete chat", "Clear chat", "Export chat",
                "Toggle inspector", "Cancel reply", "Help"} <= titles
