"""`pagedchat chat` refuses bad options before starting the app."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from pagedchat.cli.chat import chat

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


def test_tensor_parallel_size_reaches_the_engine(tmp_path, monkeypatch, tiny_tp_model_dir):
    """The app's engine loader builds a k-worker engine; closing the app ends the workers."""
    import pagedchat.tui.app as tui_app
    from pagedchat.chat.driver import EngineDriver

    loaded = []

    class RecordingApp:
        def __init__(self, store, load, name, **options) -> None:
            self.load = load
            self.engine_stopped = True
            self.return_code = 0

        def run(self) -> None:
            driver = EngineDriver(lambda: loaded.append(self.load()) or loaded[0], lambda e: None)
            driver.start()
            assert driver.stop(timeout=120)

    monkeypatch.setattr(tui_app, "ChatApp", RecordingApp)
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "c.db"), "--model",
                                      str(tiny_tp_model_dir), "--kv-blocks", "32", "-tp", "2"])
    assert result.exit_code == 0, result.output
    engine = loaded[0]
    assert engine.config.tensor_parallel_size == 2
    assert not any(worker.is_alive() for worker in engine.runner.workers)
