"""`pagedchat batch`: results, error records, resuming after Ctrl-C and after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagedchat.chat.batch import LineError, parse_line
from pagedchat.cli import app
from pagedchat.engine.llm_engine import LLMEngine

runner = CliRunner()


def _jsonl(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def opts(tiny_model_dir) -> list[str]:
    return ["--model", str(tiny_model_dir), "--kv-blocks", "64"]


def _counting_lines(n: int) -> list[dict]:
    """Requests that finish one after another: request i makes 2 * (i + 1) tokens."""
    return [{"id": f"r{i}", "prompt": f"Count to {i}.", "max_tokens": 2 * (i + 1),
             "temperature": 0, "ignore_eos": True} for i in range(n)]


def test_prompts_and_messages_to_a_file(opts, tmp_path):
    source = _jsonl(tmp_path / "in.jsonl",
                    {"id": "p", "prompt": "Hello", "max_tokens": 3, "temperature": 0},
                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                    {"id": 7, "prompt": "Pick", "n": 2, "max_tokens": 2, "seed": 1})
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 0, result.output
    records = {json.dumps(r["id"]): r for r in _records(out)}
    assert set(records) == {'"p"', "2", "7"}  # line 2 has no id: its line number
    assert records['"p"']["finish_reason"] == "length"
    assert records['"p"']["usage"]["completion_tokens"] == 3
    assert isinstance(records["7"]["text"], list) and len(records["7"]["text"]) == 2
    assert records["7"]["usage"]["completion_tokens"] == 4
    assert "3 done, 0 failed" in result.stderr


@pytest.mark.parametrize("text, reason", [
    ('{"id": "a", "prompt": "open', "Unterminated string starting at column 23"),
    ("{not json", "Expecting property name enclosed in double quotes at column 2"),
])
def test_malformed_json_says_where_once(text, reason):
    with pytest.raises(LineError, match=f"^malformed JSON \\({reason}\\)$"):
        parse_line(text, 1, None, None, {})


@pytest.mark.parametrize("text", ['{"id": NaN, "prompt": "x"}', '{"id": -Infinity}',
                                  '{"id": 1e400, "prompt": "x"}'])
def test_an_id_no_json_reader_could_read_back_is_refused_under_the_line_number(text):
    with pytest.raises(LineError, match="^id must be a string or a finite number$") as error:
        parse_line(text, 3, None, None, {})
    assert error.value.request_id == 3


def test_lines_end_at_newlines_only_after_a_byte_order_mark(opts, tmp_path):
    """A BOM is no part of line 1; CRLF ends a line; U+2028 and U+0085, legal inside a
    JSON string (``ensure_ascii=False`` writes them raw), split none."""
    lines = [{"id": "sep", "prompt": "a\u2028b\u0085c", "max_tokens": 2},
             {"id": "after", "prompt": "Hi", "max_tokens": 2}]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + b"".join(
        json.dumps(line, ensure_ascii=False).encode() + b"\r\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 0, result.output
    assert {(r["id"], r["line"]) for r in _records(out)} == {("sep", 1), ("after", 2)}
    assert "2 lines: 2 done, 0 failed" in result.stderr


def test_a_bad_default_ends_the_run_before_the_model_loads(tmp_path):
    source = _jsonl(tmp_path / "in.jsonl", {"id": "a", "prompt": "x"})
    result = runner.invoke(app, ["batch", str(source), "--model", "/no/such.gguf",
                                 "--temperature", "inf"])
    assert result.exit_code == 1 and "temperature must be a finite number" in result.output


def test_stdin_to_stdout_with_a_shared_system_prompt(opts):
    system = "You are a terse assistant who answers every question in one short line. " * 3
    lines = [{"id": i, "messages": [{"role": "user", "content": f"Question {i}?"}],
              "max_tokens": 2} for i in range(3)]
    result = runner.invoke(app, ["batch", "-", "-o", "-", "--system", system, *opts],
                           input="".join(json.dumps(line) + "\n" for line in lines))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["id"] for r in records) == [0, 1, 2]
    cached = [r["usage"]["cached_tokens"] for r in records]
    # the first request computes the system prompt; the other two find it in the cache
    assert sum(1 for c in cached if c >= 16) == 2
    assert "from the prefix cache" in result.stderr


def test_an_id_less_line_never_takes_an_id_another_line_gives_itself(opts, tmp_path):
    """Line 1 has no id and line 3 calls itself 1; line 2 cannot be read and line 4 calls
    itself 2; line 6's id is null and line 7 calls itself 6: each of lines 1, 2 and 6 is then
    named "line N", so no line is refused as a duplicate and every id names one request."""
    source = _jsonl(tmp_path / "in.jsonl",
                    {"prompt": "Hello", "max_tokens": 2},
                    "{not json",
                    {"id": 1, "prompt": "Hi", "max_tokens": 2},
                    {"id": 2, "prompt": "Bye", "max_tokens": 2},
                    {"prompt": "Again", "max_tokens": 2},
                    {"id": None, "prompt": "Null id", "max_tokens": 2},
                    {"id": 6, "prompt": "Six", "max_tokens": 2})
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 1  # the unreadable line and the null id
    by_line = {r["line"]: r for r in _records(out)}
    assert {line: r["id"] for line, r in by_line.items()} == {
        1: "line 1", 2: "line 2", 3: 1, 4: 2, 5: 5, 6: "line 6", 7: 6}
    assert [line for line, r in by_line.items() if "error" in r] == [2, 6]
    assert "malformed JSON" in by_line[2]["error"]
    assert "id must be a string or a finite number" in by_line[6]["error"]
    rerun = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert rerun.exit_code == 1 and "0 done, 2 failed, 5 skipped" in rerun.stderr  # resumed


def test_bad_lines_get_error_records_and_the_rest_runs(opts, tmp_path):
    source = _jsonl(tmp_path / "in.jsonl",
                    {"id": "ok", "prompt": "Hello", "max_tokens": 2},
                    "{not json",
                    {"id": "typo", "prompt": "x", "max_token": 3},
                    {"id": "ok", "prompt": "again"},
                    {"id": "huge", "prompt": "word " * 1100},
                    {"id": "both", "prompt": "x", "messages": []},
                    {"id": "hot", "prompt": "x", "temperature": -1},
                    r'{"id": "lone", "messages": [{"role": "user", "content": "a\ud800"}]}',
                    '{"prompt": "x", "stop": ' + "[" * 50_000 + "]" * 50_000 + "}",
                    "",
                    {"id": "ok2", "prompt": "Bye", "max_tokens": 2})
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 1
    errors = {r["line"]: r for r in _records(out) if "error" in r}
    assert errors[2]["id"] == 2 and "malformed JSON" in errors[2]["error"]
    assert "unknown field 'max_token'" in errors[3]["error"]
    assert "duplicate id (first on line 1)" in errors[4]["error"]
    assert "context is 1024 tokens" in errors[5]["error"]
    assert "exactly one of" in errors[6]["error"]
    assert "temperature" in errors[7]["error"]
    assert errors[8]["id"] == "lone" and errors[8]["param"] == "messages.0.content"
    assert "lone surrogate U+D800 at character 1" in errors[8]["error"]
    assert errors[9]["error"] == "malformed JSON (nested too deeply)"  # not the run's end
    assert {r["id"] for r in _records(out) if "text" in r} == {"ok", "ok2"}
    assert "line 2: malformed JSON" in result.stderr


def test_missing_input_and_bad_option_value(opts, tmp_path):
    result = runner.invoke(app, ["batch", str(tmp_path / "nope.jsonl"), *opts])
    assert result.exit_code == 1
    assert "nope.jsonl: no such file" in result.stderr
    folder = runner.invoke(app, ["batch", str(tmp_path), *opts])
    assert folder.exit_code == 1 and "a folder, not a file of requests" in folder.stderr
    source = _jsonl(tmp_path / "in.jsonl", {"prompt": "x"})
    assert runner.invoke(app, ["batch", str(source), "--temperature", "-1", *opts]).exit_code == 2


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux's full disk)")
def test_a_full_disk_names_the_output_it_could_not_write(opts, tmp_path):
    source = _jsonl(tmp_path / "in.jsonl", {"prompt": "x", "max_tokens": 2})
    result = runner.invoke(app, ["batch", str(source), "-o", "/dev/full", *opts])
    assert result.exit_code == 1
    assert "error: cannot write /dev/full: No space left on device" in result.stderr


def test_ctrl_c_stops_cleanly_and_a_rerun_finishes(opts, tmp_path, monkeypatch):
    source = _jsonl(tmp_path / "in.jsonl", *_counting_lines(6))
    out = tmp_path / "out.jsonl"
    step, calls = LLMEngine.step, []

    def interrupted_step(self):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(LLMEngine, "step", interrupted_step)
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 130
    assert "interrupted" in result.stderr
    first = [r["id"] for r in _records(out)]
    assert 0 < len(first) < 6
    monkeypatch.setattr(LLMEngine, "step", step)
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 0, result.output
    assert f"{len(first)} skipped" in result.stderr
    assert Counter(r["id"] for r in _records(out)) == {f"r{i}": 1 for i in range(6)}


KILLED_RUN = """
import os, signal, sys
from pagedchat.engine.llm_engine import LLMEngine
kill_at, step, calls = int(sys.argv[1]), LLMEngine.step, []
def killing_step(self):
    calls.append(1)
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self)
LLMEngine.step = killing_step
from pagedchat.cli import app
app(sys.argv[2:])
"""


def test_killed_run_resumes_without_losing_or_repeating(opts, tmp_path):
    """Issue 26: line 10 repeats the id q3 and is rejected before q3 is answered; the kill
    comes between the two, and the rerun must still answer q3."""
    lines = [{**line, "id": f"q{i}"} for i, line in enumerate(_counting_lines(12))]
    lines.insert(9, {"id": "q3", "prompt": "Count to 3 again."})
    source = _jsonl(tmp_path / "in.jsonl", *lines, "oops")
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, "7", "batch", str(source),
                             "-o", str(out), *opts], env=env, capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    before = _records(out)
    errors = {r["line"]: r for r in before if "error" in r}
    assert set(errors) == {10, 14}  # the rejected lines' records came first
    assert errors[10]["id"] == "q3" and "duplicate id (first on line 4)" in errors[10]["error"]
    answered = [r["id"] for r in before if "text" in r]
    assert 0 < len(answered) < 12 and "q3" not in answered
    result = runner.invoke(app, ["batch", str(source), "-o", str(out), *opts])
    assert result.exit_code == 1  # the rejected lines still count as failed
    after = _records(out)
    assert Counter(r["id"] for r in after if "text" in r) == {f"q{i}": 1 for i in range(12)}
    assert f"{len(answered)} skipped (answered by an earlier run)" in result.stderr
    assert Counter(r["line"] for r in after if "error" in r) == {10: 1, 14: 1}
    assert all(lines[r["line"] - 1]["id"] == r["id"] for r in after if "text" in r)


def test_tensor_parallel_batch_gives_the_same_text(tiny_tp_model_dir, tmp_path):
    source = _jsonl(tmp_path / "in.jsonl", *_counting_lines(3))
    texts = []
    for size in ("1", "2"):
        out = tmp_path / f"out-{size}.jsonl"
        result = runner.invoke(app, ["batch", str(source), "-o", str(out), "--model",
                                     str(tiny_tp_model_dir), "--kv-blocks", "64",
                                     "--tensor-parallel-size", size])
        assert result.exit_code == 0, result.output
        texts.append({r["id"]: r["text"] for r in _records(out)})
    assert texts[0] == texts[1] and len(texts[0]) == 3
