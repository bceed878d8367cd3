"""`pagedchat run --logprobs K`: the reply on stdout unchanged, one scored line per token."""

from __future__ import annotations

from typer.testing import CliRunner

from pagedchat.cli import app


def test_run_logprobs_prints_each_token(tiny_model_dir):
    runner = CliRunner()
    args = ["run", "--model", str(tiny_model_dir), "--max-tokens", "5", "--temperature", "0"]
    plain = runner.invoke(app, [*args, "Hello there"])
    scored = runner.invoke(app, [*args, "--logprobs", "2", "Hello there"])
    assert plain.exit_code == scored.exit_code == 0, scored.output
    assert scored.stdout == plain.stdout
    lines = scored.stderr.splitlines()
    assert len(lines) == 5 and all("rank 1" in line for line in lines)  # greedy
    assert all(line.count("  ") >= 2 for line in lines)
