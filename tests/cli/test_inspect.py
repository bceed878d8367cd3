"""`pagedchat inspect`: the default scenario, own prompts, preemption, stepping, errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app, inspect_render

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> list[str]:
    return ["--model", str(tiny_model_dir)]


def test_default_scenario_shows_every_kind_of_sharing(model, tmp_path):
    out = tmp_path / "snapshots.json"
    result = runner.invoke(app, ["inspect", *model, "--kv-blocks", "48", "--max-tokens", "4",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    snapshots = json.loads(out.read_text())["snapshots"]
    events = [e for s in snapshots for e in s["events"]]
    assert "chat-1 arrives" in events and any(e.startswith("beam-2") for e in events)
    chat2 = next(e for e in events if e.startswith("chat-2 finished"))
    assert "(length, 0 prompt tokens" not in chat2  # it found chat-1's system prompt
    assert max(s["stats"]["shared_blocks"] for s in snapshots) > 0  # n = 3 share the prompt
    assert snapshots[-1]["stats"]["used_blocks"] == 0  # every block came back
    assert "step 1 | chat-1 arrives" in result.stdout
    assert "block tables" in result.stdout


def test_own_prompts_under_pressure_swap_out_and_back(model, tmp_path):
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["inspect", *model, "--prompt", "one two three four five",
                                 "--prompt", "six seven eight nine ten", "--prompt", "eleven",
                                 "--kv-blocks", "6", "--block-size", "4", "--max-tokens", "12",
                                 "--preemption", "swap", "--json", str(out)])
    assert result.exit_code == 0, result.output
    events = [e for s in json.loads(out.read_text())["snapshots"] for e in s["events"]]
    assert any("swapped out" in e for e in events)
    assert any("swapped back in" in e for e in events)
    assert sum(e.endswith(" arrives") for e in events) == 3


def test_step_mode_waits_for_enter_and_q_quits(model, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n\nGood morning\n")
    result = runner.invoke(app, ["inspect", *model, "--file", str(prompts), "--step",
                                 "--max-tokens", "20", "--kv-blocks", "32"], input="\n\nq\n")
    assert result.exit_code == 0, result.output
    assert [line.split(" |")[0] for line in result.stdout.splitlines()
            if line.startswith("step ")] == ["step 1", "step 2", "step 3"]
    assert "prompt-2 arrives" in result.stdout


def test_errors(model, tmp_path):
    result = runner.invoke(app, ["inspect", *model, "--file", str(tmp_path / "none.txt")])
    assert result.exit_code == 1 and "no such file" in result.output
    assert runner.invoke(app, ["inspect", *model, "--preemption", "drop"]).exit_code == 2


def test_every_prompt_refused_ends_with_an_error(model, tmp_path):
    """A pool too small for every prompt: each step names the refusal, the JSON is written,
    and the command ends with an error (exit 1); one prompt that fits is not an error."""
    out = tmp_path / "s.json"
    long = " ".join(["word"] * 40)
    result = runner.invoke(app, ["inspect", *model, "--prompt", long, "--prompt", long,
                                 "--kv-blocks", "2", "--block-size", "4", "--json", str(out)])
    assert result.exit_code == 1
    assert "prompt-1 refused: " in result.stdout and "prompt-2 refused: " in result.stdout
    assert "every request was refused" in result.output
    assert json.loads(out.read_text())["snapshots"]
    fits = runner.invoke(app, ["inspect", *model, "--prompt", long, "--prompt", "hi",
                               "--kv-blocks", "4", "--block-size", "4", "--max-tokens", "2"])
    assert fits.exit_code == 0, fits.output
    assert "prompt-1 refused: " in fits.stdout


@pytest.mark.parametrize("content, words", [
    (None, "a folder, not a file of prompts"), (b"", "no prompts in it"),
    (b"  \n\n", "no prompts in it"),
    (b"hello\n\xff\n", "not UTF-8 text (invalid start byte at byte 6)")])
def test_a_file_of_no_prompts_is_named_before_the_model_loads(tmp_path, content, words):
    path = tmp_path / "prompts"
    path.mkdir() if content is None else path.write_bytes(content)
    result = runner.invoke(app, ["inspect", "--model", "/no/such.gguf", "--file", str(path)])
    assert result.exit_code == 1 and f"{path}: {words}" in result.output.replace("\n", "")


def test_pool_grid_letters_and_states():
    from pagedchat.engine.outputs import BlockEntry, EngineStats, SeqBlockTable

    entry = BlockEntry(0, 1, 16, 2, True, True)
    stats = EngineStats(
        total_blocks=5, block_size=16, used_blocks=2, free_blocks=2, cached_blocks=1,
        live_tokens=20, empty_slots=12, utilization=0.6, internal_fragmentation=0.4,
        shared_blocks=1, saved_blocks=1, prefix_queries=1, prefix_hits=1, prefix_hit_rate=1.0,
        preemptions=0, swapped_out=0, swapped_in=0, host_blocks_used=0, num_running=2,
        num_waiting=0, num_swapped=0,
        block_tables=[SeqBlockTable("x", 0, [entry]), SeqBlockTable("y", 0, [entry])],
        pool=["cached", "shared", "used", "free", "free"], owners={1: ["x", "y"], 2: ["y"]})
    assert inspect_render.pool_grid(stats).plain == "c+b.."
    assert inspect_render.owner_letters(stats) == {"x": "a", "y": "b"}
    assert inspect_render.pool_grid(stats, width=2).plain == "c+\nb.\n."
