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


def test_the_kv_store_is_on_by_default_and_its_flags_are_checked(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("pagedchat.tui.main.run_chat", lambda **options: seen.update(options))
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    db = ["--db", str(tmp_path / "c.db"), "--config", str(tmp_path / "none.toml")]
    assert CliRunner().invoke(app, db).exit_code == 0
    assert seen["engine_options"]["kv_store"] == str(tmp_path / "kv")
    assert seen["engine_options"]["kv_store_cap"] == "2GiB"
    assert CliRunner().invoke(app, [*db, "--no-kv-store"]).exit_code == 0
    assert "kv_store" not in seen["engine_options"]
    assert CliRunner().invoke(app, [*db, "-tp", "2"]).exit_code == 0
    assert "kv_store" not in seen["engine_options"]  # not with tensor parallelism, unless asked
    for flags, words in ((["--kv-store", "x", "--no-kv-store"], "do not combine"),
                         (["--kv-store", "x", "-tp", "2"], "--tensor-parallel-size")):
        result = CliRunner().invoke(app, [*db, *flags])
        assert result.exit_code == 2 and words in result.output
