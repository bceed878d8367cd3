"""`pagedchat run`: one answer streamed to stdout, errors named with a non-zero exit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app

runner = CliRunner()


def test_run_streams_an_answer_and_reports_stats(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "6",
                                 "--temperature", "0", "-v", "Hello there"])
    assert result.exit_code == 0, result.output
    assert "eval count:           6 token(s)" in result.output
    assert "finish reason:        length" in result.output


def test_run_shows_the_kv_dtype_in_force(tiny_model_dir):
    """-v names the KV cache's element type; an int8 pool of the same bytes holds about
    3.5x the blocks (heads of 16: 18 bytes a token and head against 64)."""
    blocks = {}
    for kv, shown in (("auto", "float32"), ("int8", "int8")):
        result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "2",
                                     "--kv-memory", "1MiB", "--kv-cache-dtype", kv, "-v", "hi"])
        assert result.exit_code == 0, result.output
        (line,) = [x for x in result.output.splitlines() if x.startswith("kv cache:")]
        assert line.endswith(f" MiB, {shown})"), line
        blocks[kv] = _stat(result.output, "kv cache:")
    per_block = 2 * 2 * 16 * 2  # K and V, 2 layers, 16 tokens, 2 KV heads
    assert blocks == {"auto": 2**20 // (per_block * 16 * 4), "int8": 2**20 // (per_block * 18)}
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--kv-cache-dtype",
                                 "int4", "hi"])
    assert result.exit_code == 1 and "kv_cache_dtype must be auto or int8" in result.output


def test_run_reads_the_prompt_from_stdin(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "3",
                                 "-"], input="a question from a pipe\n")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args, stdin", [([""], None), (["  \n"], None), (["-"], b""),
                                         (["-"], b"\n")])
def test_run_refuses_an_empty_prompt_before_loading(args, stdin):
    result = runner.invoke(app, ["run", "--model", "/no/such/model.gguf", *args], input=stdin)
    assert result.exit_code == 2 and "the prompt is empty" in result.output


def test_run_stops_quietly_when_its_reader_goes_away(tiny_model_dir):
    """`pagedchat run ... | head`: the closed pipe ends the run with no error message."""
    process = subprocess.Popen([sys.executable, "-m", "pagedchat.cli", "run", "--model",
                                str(tiny_model_dir), "--max-tokens", "8", "hi"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the model has loaded: its first token finds no reader
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 141, errors.decode()
    assert b"error" not in errors.lower() and b"Traceback" not in errors


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux's full disk)")
def test_run_says_the_reply_could_not_be_written_to_a_full_disk(tiny_model_dir):
    """`pagedchat run ... > /dev/full`: one line naming standard output and the full disk."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "pagedchat.cli", "run", "--model",
                               str(tiny_model_dir), "--max-tokens", "8", "hi"], stdout=full,
                              stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 1
    assert "error: cannot write standard output: No space left on device" in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def test_a_byte_order_mark_on_stdin_is_no_part_of_the_prompt(tiny_model_dir):
    def prompt_tokens(stdin: bytes) -> str:
        result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "1",
                                     "-v", "-"], input=stdin)
        assert result.exit_code == 0, result.output
        return next(line for line in result.output.splitlines() if "prompt eval count" in line)

    assert prompt_tokens(b"\xef\xbb\xbfHello there\n") == prompt_tokens(b"Hello there\n")


def test_run_names_a_missing_model():
    result = runner.invoke(app, ["run", "--model", "/no/such/model.gguf", "hi"])
    assert result.exit_code == 1
    assert "/no/such/model.gguf: no such file or folder" in result.output


@pytest.mark.parametrize("command", ["run", "chat", "serve", "inspect"])
@pytest.mark.parametrize("first", [True, False])
def test_speculative_tokens_without_speculation_are_refused_not_ignored(command, first):
    """Before or after the other options, --num-speculative-tokens alone is a usage error
    naming it; beside --speculative ngram it is taken."""
    given = ["--num-speculative-tokens", "4"]
    result = runner.invoke(app, [command, *given, "--model", "/no/such/model.gguf"] if first
                           else [command, "--model", "/no/such/model.gguf", *given])
    assert result.exit_code == 2
    assert "'--num-speculative-tokens': it needs --speculative ngram" in result.output
    with_it = runner.invoke(app, ["run", *given, "--speculative", "ngram", "--model",
                                  "/no/such/model.gguf", "hi"])
    assert with_it.exit_code == 1 and "no such file or folder" in with_it.output


@pytest.mark.parametrize("args, stdin, hint", [
    (["bad \udcff byte"], None, "PROMPT"),  # argv bytes that are not UTF-8, as Python has them
    (["-"], b"piped \xfe", "PROMPT"),  # a pipe's bytes
    (["--system", "\udcff", "hi"], None, "--system"),
])
def test_run_refuses_text_that_is_not_utf8(tiny_model_dir, args, stdin, hint):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), *args], input=stdin)
    assert result.exit_code == 2
    assert hint in result.output and "lone surrogate" in result.output


def test_run_says_so_when_corrupt_weights_compute_nan(tiny_model_dir, tmp_path):
    """A file whose weights are garbage (here: a NaN in a layer) makes no reply: the
    run ends with one line naming the cause, not an empty reply and exit 0."""
    from safetensors.torch import load_file, save_file

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, corrupt)
    weights = load_file(corrupt / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(weights, corrupt / "model.safetensors", metadata={"format": "pt"})
    result = runner.invoke(app, ["run", "--model", str(corrupt), "--max-tokens", "4", "hi"])
    assert result.exit_code == 1
    assert "computed NaN or infinity in this step: its weights look corrupt" in result.stderr


def test_run_rejects_impossible_sampling(tiny_model_dir):
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--top-p", "1.5", "hi"])
    assert result.exit_code == 1
    assert "top_p must be in (0, 1]" in result.output


def test_the_installed_command_freezes_what_imports_made():
    """`pagedchat` is cli.main, which hands the import-time objects to gc.freeze before the
    app runs (in a child process: freezing this one would keep the suite's garbage)."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "pagedchat"]
    assert script.value == "pagedchat.cli:main"
    probe = ("import gc, pagedchat.cli as cli\n"
             "cli.app = lambda: print(gc.get_freeze_count())\n"
             "cli.main()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert int(done.stdout.strip()) > 10_000  # typer's and rich's, before torch comes in


def _stat(output: str, label: str) -> int:
    (line,) = [line for line in output.splitlines() if line.startswith(label)]
    return int(line.split(":", 1)[1].split()[0])


def test_run_sizes_the_kv_pool_to_its_request(tiny_model_dir):
    """One request: the pool holds its prompt and max_tokens (whole blocks of 16), not the
    engine's default budget; an explicit --kv-blocks or --kv-memory wins."""
    # a long prompt and few tokens to generate, together past the pool's 256-token floor
    prompt = "Count with me: " + " ".join(["one two three four five six seven"] * 40)
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "40",
                                 "-v", prompt])
    assert result.exit_code == 0, result.output
    prompt_tokens = _stat(result.output, "prompt eval count:")
    assert prompt_tokens + 40 > 256 + 16
    assert _stat(result.output, "kv cache:") == -(-(prompt_tokens + 40) // 16)
    for option in (["--kv-blocks", "40"], ["--kv-memory", "320KiB"]):
        result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "2",
                                     "-v", *option, "hi"])
        assert result.exit_code == 0, result.output
        assert _stat(result.output, "kv cache:") == 40


def test_run_shows_progress_before_it_loads_torch(tiny_model_dir, monkeypatch):
    """The first thing a run shows (stderr, a terminal's) is a spinner over the imports of
    torch and the engine: a first start's own tasks come later, seconds into the run."""
    from contextlib import contextmanager

    from pagedchat import console

    shown = []

    @contextmanager
    def record(description, total):
        shown.append(description)
        yield lambda k=1: None

    monkeypatch.setattr(console, "progress", record)
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--max-tokens", "2",
                                 "hi"])
    assert result.exit_code == 0, result.output
    assert shown[:1] == ["starting: loading torch and the engine"]
