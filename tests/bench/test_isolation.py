"""`bench isolation` on the tiny model: both phases measured, the big bodies refused with
413 (read to their end, so the client sees the answer), the streams unharmed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pagedchat.cli import app


def test_isolation_measures_both_phases_and_every_big_body_is_a_413(tiny_model_dir, tmp_path):
    out = tmp_path / "isolation.json"
    result = CliRunner().invoke(app, [
        "bench", "isolation", "--model", str(tiny_model_dir), "--kv-memory", "16MiB",
        "--streams", "2", "--max-tokens", "48", "--floods", "1", "--body-mb", "2",
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    alone, flooded = figures["engines"]["alone"], figures["engines"]["flooded"]
    assert alone["big_requests"] == 0 and flooded["big_requests"] >= 1
    assert flooded["big_request_statuses"] == "413"
    for phase in (alone, flooded):
        assert phase["worst_chunk_gap_ms"] > 0 and phase["health_failures"] == 0
    assert figures["worst_gap_ratio"] > 0
