"""`pagedchat run`: one answer streamed to stdout, errors named with a non-zero exit."""

from __future__ import annotations

from typer.testing import CliRunner

from pagedchat.cli import app

runner = CliRunner()


def test_run_streams_an_answer_and_reports_stats(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "6",
                                 "--temperature", "0", "-v", "Hello there"])
    assert result.exit_code == 0, result.output
    assert "eval count:           6 token(s)" in result.output
    assert "finish reason:        length" in result.output


def test_run_reads_the_prompt_from_stdin(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "3",
                                 "-"], input="a question from a pipe\n")
    assert result.exit_code == 0, result.output


def test_run_names_a_missing_model():
    result = runner.invoke(app, ["run", "--model", "/no/such/model.gguf", "hi"])
    assert result.exit_code == 1
    assert "/no/such/model.gguf: no such file or folder" in result.output


def test_run_rejects_impossible_sampling(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--top-p", "1.5", "hi"])
    assert result.exit_code == 1
    assert "top_p must be in (0, 1]" in result.output
