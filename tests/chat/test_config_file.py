"""The chat's defaults from config.toml, under its own flags; a bad file is one clear error."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pagedchat.chat.config_file import ConfigError, config_path, read_config
from pagedchat.chat.conversation import SamplingSettings
from pagedchat.cli import app


def test_the_file_lives_under_xdg_config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_path() == tmp_path / "pagedchat" / "config.toml"
    assert read_config() == {}  # no file: no defaults


@pytest.mark.parametrize("text, words", [
    ("temperature = -1", "temperature"),
    ("colour = 'blue'", "unknown key 'colour'"),
    ("max_tokens = 'many'", "max_tokens"),
    ("kv_blocks = true", "kv_blocks must be a int"),
    ("loop_guard = 3", "loop_guard must be true or false"),
    ("temperature = ", "cannot read it"),
])
def test_a_bad_file_names_itself_and_the_key(tmp_path, text, words):
    path = tmp_path / "config.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as caught:
        read_config(path)
    assert str(path) in str(caught.value) and words in str(caught.value)


def test_flags_win_over_the_file_which_wins_over_the_defaults(monkeypatch, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('model = "gemma-3-270m"\nsystem = "Be brief."\ntemperature = 0.2\n'
                    "max_tokens = 64\nloop_guard = false\ncontext_window = 512\n")
    seen = {}

    monkeypatch.setattr("pagedchat.tui.main.run_chat", lambda **options: seen.update(options))
    result = CliRunner().invoke(app, ["chat", "--config", str(path), "--max-tokens", "99",
                                      "--system", "Answer in French."])
    assert result.exit_code == 0, result.output
    engine_options = seen["engine_options"]
    assert seen["model"] == "gemma-3-270m" and seen["context_window"] == 512
    assert engine_options["num_kv_blocks"] == 512 and engine_options["kv_cache_dtype"] == "auto"
    assert seen["settings"] == SamplingSettings(temperature=0.2, max_tokens=99, loop_guard=False)
    assert seen["system_prompt"] == "Answer in French."
    path.write_text("temperature = 9e999\n")
    result = CliRunner().invoke(app, ["chat", "--config", str(path)])
    assert result.exit_code == 2 and "temperature" in result.output
