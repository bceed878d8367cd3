"""`pagedchat inspect` on a model with sliding-window layers: the global and local layer
groups' tables, and the blocks the window gives back."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pagedchat.cli import app
from tests.engine.models.test_gemma3 import save_tiny_gemma3

runner = CliRunner()


def test_inspect_shows_layer_groups_and_window_frees(tmp_path, tiny_tokenizer):
    folder = save_tiny_gemma3(tmp_path / "gemma", tiny_tokenizer)
    out = tmp_path / "snapshots.json"
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    result = runner.invoke(app, ["inspect", "--model", str(folder), "--prompt", prompt,
                                 "--block-size", "4", "--kv-blocks", "128", "--max-tokens",
                                 "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "local 1" in result.output and "global 0" in result.output
    assert "blocks freed by window" in result.output
    snapshots = json.loads(out.read_text())["snapshots"]
    assert snapshots[0]["stats"]["group_windows"] == [None, 16, 16, 16]
    events = [e for s in snapshots for e in s["events"]]
    assert any("slid out of the window" in e for e in events)
    assert snapshots[-1]["stats"]["window_freed_blocks"] > 0
