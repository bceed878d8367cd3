"""Property: however often a batch is SIGKILLed, running it to the end leaves one answer per
accepted request, one error record per rejected line and nothing else.

Each run is a fork of one process that loaded the tiny model once (with a single math
thread, so that forking is safe); the fork kills itself with SIGKILL at a drawn point:
before an engine step, part-way through writing a record, or before the rename that
rewrites the output on resume."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

ZYGOTE = r"""
import json, os, signal, sys, traceback
from pathlib import Path
import torch
torch.set_num_threads(1)
from pagedchat import LLM
import pagedchat.chat.batch as batch
from pagedchat.engine.llm_engine import LLMEngine

engine = LLM(model=sys.argv[1], num_kv_blocks=64, block_size=16).engine


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def arm(where, count, cut):
    calls = []
    if where == "step":
        step = LLMEngine.step
        def killing_step(self):
            calls.append(1)
            if len(calls) == count:
                die()
            return step(self)
        LLMEngine.step = killing_step
    elif where == "write":
        write = batch.write_record
        def killing_write(sink, record):
            calls.append(1)
            if len(calls) == count:
                line = json.dumps(record, ensure_ascii=False) + "\n"
                sink.write(line[: round(cut * len(line))])
                sink.flush()
                die()
            write(sink, record)
        batch.write_record = killing_write
    else:
        os.replace = lambda *args: die()


def run(source, out):
    lines = Path(source).read_text().splitlines()
    done = batch.load_done(Path(out))  # as the batch command does: load, then append
    with open(out, "a", encoding="utf-8") as sink:
        return batch.run_batch(engine, lines, sink, done, warn=lambda m: None).exit_code


while command := sys.stdin.readline():
    spec = json.loads(command)
    pid = os.fork()
    if pid == 0:
        try:
            if spec["kill"]:
                arm(*spec["kill"])
            os._exit(run(spec["source"], spec["out"]))
        except BaseException:
            traceback.print_exc()
            os._exit(3)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def run_batch_in_a_fork(tiny_model_dir):
    """``run(source, out, kill)`` -> the exit status of one run (-9: killed)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(tiny_model_dir)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(source: Path, out: Path, kill: tuple | None) -> int:
        zygote.stdin.write(json.dumps({"source": str(source), "out": str(out),
                                       "kill": kill}) + "\n")
        zygote.stdin.flush()
        ready, _, _ = select.select([zygote.stdout], [], [], 300)
        answer = zygote.stdout.readline() if ready else ""
        assert answer, "the batch process did not answer (see its stderr)"
        return int(answer)

    yield run
    zygote.stdin.close()
    try:
        zygote.wait(timeout=30)
    except subprocess.TimeoutExpired:
        zygote.kill()


KINDS = ["valid", "valid", "id-less", "chat", "malformed", "duplicate", "bad params",
         "too long", "blank"]
# each once ended a whole run (no records, a traceback) or went into the engine unchecked
BAD_VALUES = [("temperature", -1), ("seed", 2**64), ("seed", "abc"), ("top_k", 2**63),
              ("stop", [1]), ("stop_token_ids", [10**9]), ("n", "2"), ("max_tokens", 0),
              ("temperature", float("nan")), ("repetition_penalty", float("inf")),
              ("messages", [{"role": "wizard", "content": "Hi"}])]


@st.composite
def batch_files(draw) -> tuple[list[str], dict[int, tuple[str, object]], dict[int, str]]:
    """Lines of a batch file, what each non-blank line must end with in the output:
    ("text", id) for an accepted request, ("error", id) for a rejected line, and the field
    the error record of a line with a bad value must name."""
    lines: list[str] = []
    expected: dict[int, tuple[str, object]] = {}
    faults: dict[int, str] = {}  # line -> the field its error record must name
    ids: list[str] = []  # every explicit id so far, accepted or not
    for number, kind in enumerate(draw(st.lists(st.sampled_from(KINDS), min_size=1,
                                                max_size=8)), 1):
        fresh = f"r{number}"
        params = {"max_tokens": draw(st.integers(1, 3)), "temperature": 0}
        if kind == "duplicate" and ids:
            rid = draw(st.sampled_from(ids))
            lines.append(json.dumps({"id": rid, "prompt": "Again.", **params}))
            expected[number] = ("error", rid)
        elif kind == "id-less":
            lines.append(json.dumps({"prompt": f"Line {number}.", **params}))
            expected[number] = ("text", number)
        elif kind == "chat":
            messages = [{"role": "user", "content": f"Hello {number}"}]
            lines.append(json.dumps({"id": fresh, "messages": messages, **params}))
            expected[number] = ("text", fresh)
        elif kind == "malformed":
            lines.append(json.dumps({"id": fresh, "prompt": "cut"})[: draw(st.integers(1, 20))])
            expected[number] = ("error", number)
        elif kind == "bad params":  # refused naming the field (the engine's door)
            field, value = draw(st.sampled_from(BAD_VALUES))
            lines.append(json.dumps({"id": fresh, "prompt": "Hot.", field: value}
                                    if field != "messages" else {"id": fresh, field: value}))
            expected[number] = ("error", fresh)
            faults[number] = field
        elif kind == "too long":  # refused by the engine: longer than the context
            lines.append(json.dumps({"id": fresh, "prompt": "word " * 1100, **params}))
            expected[number] = ("error", fresh)
        elif kind == "blank":
            lines.append("")
        else:
            lines.append(json.dumps({"id": fresh, "prompt": f"Count to {number}.", **params}))
            expected[number] = ("text", fresh)
        if kind in ("valid", "chat", "bad params", "too long") or (kind == "duplicate"
                                                                    and not ids):
            ids.append(fresh)
    return lines, expected, faults


kill_points = st.lists(st.tuples(st.sampled_from(["step", "write", "rename"]),
                                 st.integers(1, 8), st.floats(0, 1)), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batch_files(), kills=kill_points)
def test_killed_any_number_of_times_then_run_to_the_end(run_batch_in_a_fork, batch, kills):
    lines, expected, faults = batch
    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        source.write_text("\n".join(lines) + "\n")
        for kill in kills:
            assert run_batch_in_a_fork(source, out, kill) in (-9, 0, 1)
        failed = any(kind == "error" for kind, _ in expected.values())
        assert run_batch_in_a_fork(source, out, None) == int(failed)
        text = out.read_text()
        assert text.endswith("\n") or not text
        records = [json.loads(line) for line in text.splitlines()]
        assert sorted(r["line"] for r in records) == sorted(expected)  # one record a line
        for record in records:
            kind, request_id = expected[record["line"]]
            assert ("error" if "error" in record else "text") == kind, record
            assert record["id"] == request_id
            if record["line"] in faults:  # the field at fault is named
                field = faults[record["line"]]
                assert record["param"] == field and field in record["error"], record
        # a rerun of a finished batch writes the same records again, and no others
        assert run_batch_in_a_fork(source, out, None) == int(failed)
        assert Counter(out.read_text().splitlines()) == Counter(text.splitlines())
        assert sorted(os.listdir(folder)) == ["in.jsonl", "out.jsonl"]
