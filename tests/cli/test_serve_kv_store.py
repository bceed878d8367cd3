"""`pagedchat serve --kv-store DIR` gives the engine a KV store (none without it)."""

from __future__ import annotations

from typer.testing import CliRunner

from pagedchat.cli import app
from pagedchat.engine.errors import ModelLoadError


def test_serve_passes_its_kv_store_to_the_engine(monkeypatch, tmp_path):
    seen = []

    def build_engine(config):
        seen.append(config)
        raise ModelLoadError("stop here")

    monkeypatch.setattr("pagedchat.server.serve.build_engine", build_engine)
    result = CliRunner().invoke(app, ["serve", "--kv-store", str(tmp_path), "--kv-store-cap",
                                      "1GiB"])
    assert result.exit_code == 1 and "stop here" in result.output
    assert seen[-1].kv_store == str(tmp_path) and seen[-1].kv_store_cap == "1GiB"
    CliRunner().invoke(app, ["serve"])
    assert seen[-1].kv_store is None
