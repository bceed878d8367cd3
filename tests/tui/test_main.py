"""`pagedchat chat` refuses bad options before starting the app."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from pagedchat.tui.main import chat

app = typer.Typer()
app.command()(chat)


def test_unknown_session_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "c.db"), "--session", "42"])
    assert result.exit_code == 2
    assert "no session 42" in result.output


def test_unusable_database_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "file" / "c.db")])
    assert result.exit_code == 2
    assert "cannot open the chat database" in result.output
