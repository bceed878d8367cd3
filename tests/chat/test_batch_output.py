"""Reading a batch output file back to resume: what counts, what is dropped, what is refused."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pagedchat.chat.batch_output import BatchError, load_done

ANSWER_A = '{"id": "a", "line": 1, "line_hash": "00", "text": "x", "finish_reason": "stop"}'
ANSWER_C = '{"id": 3, "line": 3, "line_hash": "11", "text": "z", "finish_reason": "length"}'
ERROR_B = '{"id": "b", "line": 2, "error": "bad"}'


def test_only_answers_count_and_the_file_keeps_only_them(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(f"{ANSWER_A}\n{ERROR_B}\n\n{ANSWER_C}\n{ANSWER_A}\n" + ANSWER_C[:30])
    done = load_done(out)
    assert done == [json.loads(ANSWER_A), json.loads(ANSWER_C)]
    # the error record, the blank line, the repeated answer and the cut line are gone
    assert out.read_text() == f"{ANSWER_A}\n{ANSWER_C}\n"
    assert not list(tmp_path.glob(".*.resume"))


@pytest.mark.parametrize("cut", [1, 10, len(ANSWER_C) - 1])
def test_a_line_cut_by_a_kill_never_counts(tmp_path, cut):
    out = tmp_path / "out.jsonl"
    out.write_text(f"{ANSWER_A}\n{ANSWER_C[:cut]}")
    assert load_done(out) == [json.loads(ANSWER_A)]
    assert out.read_text() == f"{ANSWER_A}\n"


@pytest.mark.parametrize("before", ["", f"{ANSWER_A}\n"])
@pytest.mark.parametrize("last", ["My notes, do not lose", "col1,col2", '{"x": 1', "1"])
def test_a_last_line_that_no_record_begins_with_is_refused_not_dropped(tmp_path, before, last):
    """Only a record's beginning (``{"id": ``) can be a record a kill cut short: a file of
    the user's whose last line has no newline is refused, never rewritten."""
    out = tmp_path / "notes.txt"
    out.write_text(before + last)
    with pytest.raises(BatchError, match="is not JSON|neither an answer"):
        load_done(out)
    assert out.read_text() == before + last


def test_a_whole_last_line_whose_newline_was_cut_counts(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(f"{ANSWER_A}\n{ANSWER_C}")
    assert load_done(out) == [json.loads(ANSWER_A), json.loads(ANSWER_C)]
    assert out.read_text() == f"{ANSWER_A}\n{ANSWER_C}\n"


def test_a_file_with_nothing_to_drop_is_left_alone(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(f"{ANSWER_A}\n{ANSWER_C}\n")
    before = out.stat()
    assert len(load_done(out)) == 2
    after = out.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("bad, why", [
    ('{"id": "q", "prompt": "an input line, not a result"}', "is neither an answer nor an error"),
    ("[1, 2]", "is neither an answer nor an error"),
    ("{not json", "is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "is not JSON"),  # past the parser's recursion
])
def test_a_line_that_is_no_record_stops_before_anything_changes(tmp_path, bad, why):
    out = tmp_path / "out.jsonl"
    text = f"{ANSWER_A}\n{bad}\n{ERROR_B}\n"
    out.write_text(text)
    with pytest.raises(BatchError, match=f"line 2 {why}"):
        load_done(out)
    assert out.read_text() == text


def test_no_output_yet_or_not_a_regular_file(tmp_path):
    assert load_done(tmp_path / "missing.jsonl") == []
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert load_done(fifo) == []  # not read (it would block) and not replaced
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_rewrite_goes_through_a_symlink_and_keeps_the_mode(tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text(f"{ERROR_B}\n{ANSWER_A}\n")
    target.chmod(0o640)
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    assert load_done(link) == [json.loads(ANSWER_A)]
    assert link.is_symlink() and target.read_text() == f"{ANSWER_A}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
