"""Resuming a batch: only answers stand for requests, keyed by line, id and the line's text.

Each run goes the way the ``batch`` command goes: load_done, then append to the file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pagedchat import LLM
from pagedchat.chat.batch import BatchError, load_done, run_batch


def _line(request_id: object = None, prompt: str = "Say hi.", **fields) -> str:
    data = {} if request_id is None else {"id": request_id}
    return json.dumps({**data, "prompt": prompt, "max_tokens": 2, "temperature": 0, **fields})


def _run(engine, lines: list[str], out: Path):
    done = load_done(out)
    with out.open("a", encoding="utf-8") as sink:
        return run_batch(engine, lines, sink, done, warn=lambda message: None)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def _by_line(out: Path) -> dict[int, list[str]]:
    """line -> the kinds of its records ("text" or "error")."""
    kinds: dict[int, list[str]] = {}
    for record in _records(out):
        kinds.setdefault(record["line"], []).append("error" if "error" in record else "text")
    return kinds


@pytest.fixture
def engine(tiny_llm):
    return tiny_llm.engine


def test_a_rejected_line_sharing_an_id_does_not_stand_for_its_request(engine, tmp_path):
    lines = [_line("q0"), _line("q3"), _line("q3", "again")]
    out = tmp_path / "out.jsonl"
    # what a kill leaves when it comes after line 3's rejection, before q3's answer
    out.write_text(json.dumps({"id": "q3", "line": 3, "error": "duplicate id (first on line 2)"})
                   + "\n")
    summary = _run(engine, lines, out)
    assert (summary.done, summary.failed, summary.skipped) == (2, 1, 0)
    assert _by_line(out) == {1: ["text"], 2: ["text"], 3: ["error"]}
    summary = _run(engine, lines, out)  # a rerun writes no second answer or error record
    assert (summary.done, summary.failed, summary.skipped) == (0, 1, 2)
    assert _by_line(out) == {1: ["text"], 2: ["text"], 3: ["error"]}


def test_every_kind_of_line_has_one_record_after_any_number_of_reruns(engine, tmp_path):
    lines = [_line("a"), "{oops", _line(), _line("a", "dup"), _line("hot", temperature=-1),
             "", _line("long", "word " * 1100), _line(), _line(3, "takes line 3's id")]
    out = tmp_path / "out.jsonl"
    _run(engine, lines, out)
    first = Counter(out.read_text().splitlines())
    expected = {1: ["text"], 2: ["error"], 3: ["text"], 4: ["error"], 5: ["error"],
                7: ["error"], 8: ["text"], 9: ["text"]}
    assert _by_line(out) == expected
    records = {r["line"]: r for r in _records(out)}
    # id-less: their line numbers, but line 9 calls itself 3
    assert records[3]["id"] == "line 3" and records[8]["id"] == 8 and records[9]["id"] == 3
    assert "context is 1024 tokens" in records[7]["error"]  # refused by the engine
    assert "temperature" in records[5]["error"]  # refused by validation
    assert "duplicate id (first on line 1)" in records[4]["error"]
    for _ in range(2):
        summary = _run(engine, lines, out)
        assert (summary.done, summary.failed, summary.skipped) == (0, 4, 4)
        assert Counter(out.read_text().splitlines()) == first


def test_lines_added_or_fixed_since_run_and_the_rest_is_skipped(engine, tmp_path):
    lines = [_line("a"), _line("b", temperature=-1), _line()]
    out = tmp_path / "out.jsonl"
    _run(engine, lines, out)
    answers = [r for r in _records(out) if "text" in r]
    lines[1] = _line("b")  # fixed
    lines.append(_line("c"))  # appended
    summary = _run(engine, lines, out)
    assert (summary.done, summary.failed, summary.skipped) == (2, 0, 2)
    assert _by_line(out) == {1: ["text"], 2: ["text"], 3: ["text"], 4: ["text"]}
    assert [r for r in _records(out) if r["line"] in (1, 3)] == answers


@pytest.mark.parametrize("edit, why", [
    (lambda lines: lines.__setitem__(0, _line("a", "Say bye.")),
     'id "a" was written for line 1, which was edited since'),
    # an id-less line's id is its line number: the text tells that another line came there
    (lambda lines: lines.insert(1, _line(prompt="new")),
     "id 2 was written for line 2, which was edited since (and 1 more)"),
    (lambda lines: lines.insert(0, _line("z")),
     'id "a" was written for line 1, which now has id "z" (and 2 more)'),
    (lambda lines: lines.insert(1, _line("a", "second")),
     "id 2 was written for line 2, which is now rejected (duplicate id (first on line 1))"),
    (lambda lines: lines.pop(),
     "id 3 was written for line 3, which is now blank or past the end"),
])
def test_an_answer_the_input_no_longer_matches_stops_the_run(engine, tmp_path, edit, why):
    lines = [_line("a"), _line(prompt="one"), _line(prompt="two")]
    out = tmp_path / "out.jsonl"
    _run(engine, lines, out)
    before = out.read_text()
    edit(lines)
    with pytest.raises(BatchError, match="the output does not match the input") as caught:
        _run(engine, lines, out)
    assert why in str(caught.value) and "nothing was run" in str(caught.value)
    assert out.read_text() == before
    assert not engine.has_unfinished_requests()


def test_answers_written_before_they_named_their_line_are_matched_by_id(engine, tmp_path):
    lines = [_line("a"), _line(), _line("b")]
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "text": "x", "finish_reason": "length"}\n'
                   '{"id": 2, "text": "y", "finish_reason": "length"}\n')
    summary = _run(engine, lines, out)
    assert (summary.done, summary.skipped) == (1, 2)
    assert Counter(r["id"] for r in _records(out)) == {"a": 1, 2: 1, "b": 1}


def test_a_line_the_engine_had_no_room_for_runs_once_it_has(engine, tiny_model_dir, tmp_path):
    lines = [_line("small"), _line("big", "word " * 300)]
    out = tmp_path / "out.jsonl"
    with LLM(model=str(tiny_model_dir), num_kv_blocks=16, block_size=16) as small:
        summary = _run(small.engine, lines, out)
    assert (summary.done, summary.failed) == (1, 1)
    assert "KV blocks" in _records(out)[0]["error"]
    summary = _run(engine, lines, out)  # 256 blocks
    assert (summary.done, summary.failed, summary.skipped) == (1, 0, 1)
    assert _by_line(out) == {1: ["text"], 2: ["text"]}
