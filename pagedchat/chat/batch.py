"""``pagedchat batch``: JSONL requests in, JSONL results out, continuously batched.

Every valid line goes into the engine at once; each answer is appended and flushed when its
request finishes, so a killed run loses nothing finished. A rerun with the same output file
skips the requests answered there (an answer names its line number, id and a hash of the
line's text) and runs the rest, the lines it rejected before too (error records are no
answers). If the input changed under an answer, the rerun runs nothing and names the line."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import IO

from pagedchat.chat.batch_output import BatchError, key, load_done, write_record
from pagedchat.chat.prompt import render
from pagedchat.engine.errors import RequestError, invalid_text
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams

__all__ = ["BatchError", "describe", "load_done", "parse_file", "run_batch"]

SAMPLING_FIELDS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "best_of", "stop",
    "stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "use_beam_search", "length_penalty", "early_stopping"})
PROMPT_FIELDS = frozenset({"id", "prompt", "messages"})
ROLES = ("system", "user", "assistant")


class LineError(ValueError):
    """A line that cannot become a request; ``id`` is its own or its line number, ``param``
    the field at fault where one is."""

    def __init__(self, request_id: object, reason: str, param: str | None = None) -> None:
        super().__init__(reason)
        self.request_id, self.param = request_id, param


@dataclass
class BatchJob:
    request_id: object
    line: int
    digest: str
    prompt: str | list[int]
    params: SamplingParams


@dataclass
class Rejected:
    request_id: object
    line: int
    reason: str
    param: str | None = None


@dataclass
class Summary:
    requests: int = 0
    skipped: int = 0  # answered by an earlier run
    done: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    unfinished: list[object] = field(default_factory=list)
    engine_error: str | None = None  # the engine failed as a whole: the run stopped

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else 1 if self.failed or self.engine_error else 0


def parse_line(text: str, line: int, tokenizer, system: str | None,
               defaults: dict[str, object], name: object = None) -> BatchJob:
    """One input line -> a BatchJob, or LineError naming what is wrong with it; a line that
    gives no id is ``name`` (by default its line number)."""
    name = line if name is None else name
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise LineError(name, "the line is not valid UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LineError(name, f"malformed JSON ({error.msg.removesuffix(' at')} at column "
                              f"{error.colno})") from None
    except RecursionError:  # Python's parser recurses per level of nesting
        raise LineError(name, "malformed JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise LineError(name, "a line must be a JSON object")
    request_id = data.get("id", name)
    # NaN, Infinity or 1e400 would be written back as no JSON reader takes them
    if request_id is None or isinstance(request_id, (dict, list)) or (
            isinstance(request_id, float) and not math.isfinite(request_id)):
        raise LineError(name, "id must be a string or a finite number")
    if problem := invalid_text(data):
        raise LineError(request_id, problem[1], problem[0])
    if unknown := sorted(set(data) - PROMPT_FIELDS - SAMPLING_FIELDS):
        raise LineError(request_id, f"unknown field {unknown[0]!r}", unknown[0])
    if ("prompt" in data) == ("messages" in data):
        raise LineError(request_id, "give exactly one of 'prompt' or 'messages'", "prompt")
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise LineError(request_id, "'prompt' must be a non-empty string", "prompt")
        prompt: str | list[int] = f"{system}\n\n{data['prompt']}" if system else data["prompt"]
    else:
        messages = _messages(request_id, data["messages"], system)
        try:
            prompt = render(tokenizer, messages)
        except Exception as error:  # the template refuses the conversation (jinja raises)
            raise LineError(request_id, f"messages: the chat template refused them ({error})",
                            "messages") from None
    fields = {**defaults, **{k: v for k, v in data.items() if k in SAMPLING_FIELDS}}
    try:
        params = SamplingParams(**fields)
    except RequestError as error:
        raise LineError(request_id, str(error), error.param) from None
    # what ties an answer to the text of its line: the first 16 hex digits of its SHA-256
    digest = hashlib.sha256(text.strip().encode()).hexdigest()[:16]
    return BatchJob(request_id, line, digest, prompt, params)


def _messages(request_id: object, messages: object, system: str | None) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise LineError(request_id, "'messages' must be a non-empty list", "messages")
    for message in messages:
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise LineError(request_id, "messages: each needs a string 'role' and 'content'",
                            "messages")
        if message["role"] not in ROLES:
            raise LineError(request_id, f"messages: a role must be one of {', '.join(ROLES)}, "
                            f"got {message['role']!r}", "messages")
    if system and messages[0]["role"] != "system":
        return [{"role": "system", "content": system}, *messages]
    return messages


def parse_file(lines: Iterable[str], tokenizer, system: str | None,
               defaults: dict[str, object]) -> list[BatchJob | Rejected]:
    """Every non-blank line in order: its BatchJob, or why it is rejected. An id an earlier line
    has (valid or not) is rejected, so it names one request; no id means the line number, or
    "line N" where a line of the file gives that number as its own id."""
    entries: list[BatchJob | Rejected] = []
    first_line: dict[str, int] = {}
    lines = list(lines)
    taken = {key(_own_id(text)) for text in lines}
    for line, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            entry: BatchJob | Rejected = parse_line(text, line, tokenizer, system, defaults,
                                                    f"line {line}" if key(line) in taken else line)
        except LineError as error:
            entry = Rejected(error.request_id, line, str(error), error.param)
        id_key = key(entry.request_id)
        if isinstance(entry, BatchJob) and id_key in first_line:
            entry = Rejected(entry.request_id, line,
                             f"duplicate id (first on line {first_line[id_key]})")
        first_line.setdefault(id_key, line)
        entries.append(entry)
    return entries


def _own_id(text: str) -> object:
    """The id a line gives itself; None where it gives none (or is no JSON object)."""
    with contextlib.suppress(ValueError, RecursionError):
        data = json.loads(text)
        return data.get("id") if isinstance(data, dict) else None
    return None


def answered_lines(entries: list[BatchJob | Rejected],
                   done: Collection[dict[str, object]]) -> set[int]:
    """The lines ``done`` (answer records) answers; BatchError when an answer fits no request
    of ``entries`` (the input changed since: going on would lose it or write a second one)."""
    by_line = {entry.line: entry for entry in entries}
    by_id = {key(entry.request_id): entry for entry in entries if isinstance(entry, BatchJob)}
    answered: set[int] = set()
    stale: list[str] = []
    for record in done:
        line = record.get("line")
        # records written before answers carried their line name the request by id alone
        job = by_id.get(key(record["id"])) if line is None else by_line.get(line)
        if (isinstance(job, BatchJob) and key(job.request_id) == key(record["id"])
                and record.get("line_hash", job.digest) == job.digest):
            answered.add(job.line)
        else:
            stale.append(_stale(record, job))
    if stale:
        more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
        raise BatchError(f"the output does not match the input: {stale[0]}{more}; nothing was "
                         "run. Restore the input, delete those answers from the output, or "
                         "write to a new output file")
    return answered


def _stale(record: dict[str, object], entry: BatchJob | Rejected | None) -> str:
    """Why an answer record fits no request, in words."""
    head = f"the answer for id {key(record['id'])}"
    line = record.get("line")
    if line is None:
        return f"{head} matches no request of the input"
    head += f" was written for line {line}, which"
    if entry is None:
        return f"{head} is now blank or past the end"
    if isinstance(entry, Rejected):
        return f"{head} is now rejected ({entry.reason})"
    if key(entry.request_id) != key(record["id"]):
        return f"{head} now has id {key(entry.request_id)}"
    return f"{head} was edited since"


def result_record(job: BatchJob, out: RequestOutput) -> dict[str, object]:
    texts = [c.text for c in out.outputs]
    reasons = [c.finish_reason for c in out.outputs]
    single = len(out.outputs) == 1
    return {
        "id": job.request_id, "line": job.line, "line_hash": job.digest,
        "text": texts[0] if single else texts, "finish_reason": reasons[0] if single else reasons,
        "usage": {"prompt_tokens": len(out.prompt_token_ids),
                  "completion_tokens": sum(len(c.token_ids) for c in out.outputs),
                  "cached_tokens": out.num_cached_tokens}}


def run_batch(engine: LLMEngine, lines: Iterable[str], sink: IO[str],
              done: Collection[dict[str, object]], system: str | None = None,
              defaults: dict[str, object] | None = None, warn: Callable[[str], None] = print,
              progress: Callable[[int], None] = lambda steps: None) -> Summary:
    """Run every line not answered in ``done`` (from ``load_done``); one record per line
    goes to ``sink``: an answer, or an error record for a rejected line. Requests admitted
    together share their common prefix (the system prompt, the chat template)."""
    start = time.perf_counter()
    summary = Summary()
    entries = parse_file(lines, engine.tokenizer, system, defaults or {})
    answered = answered_lines(entries, done)
    queued: dict[str, BatchJob] = {}

    def fail(entry: BatchJob | Rejected, reason: str, param: str | None = None) -> None:
        summary.failed += 1
        warn(f"line {entry.line}: {reason}")
        record: dict[str, object] = {"id": entry.request_id, "line": entry.line, "error": reason}
        if param is not None:
            record["param"] = param
        write_record(sink, record)
        progress(1)

    def step() -> None:
        for out in engine.step():
            if not out.finished:
                continue
            job = queued.pop(out.request_id)
            if out.error is not None:  # the request failed inside the step; others go on
                fail(job, f"the request failed: {out.error}")
                continue
            record = result_record(job, out)
            summary.done += 1
            summary.prompt_tokens += len(out.prompt_token_ids)
            summary.cached_tokens += out.num_cached_tokens
            summary.completion_tokens += record["usage"]["completion_tokens"]
            write_record(sink, record)
            progress(1)

    def stop_all() -> None:
        for request_id, job in queued.items():
            with contextlib.suppress(Exception):  # a broken engine still lets go of them
                engine.abort_request(request_id)
            summary.unfinished.append(job.request_id)

    try:
        for entry in entries:
            summary.requests += 1
            if isinstance(entry, Rejected):
                fail(entry, entry.reason, entry.param)
            elif entry.line in answered:
                summary.skipped += 1
                progress(1)
            else:
                try:
                    engine.add_request(f"batch-{entry.line}", entry.prompt, entry.params)
                except RequestError as error:
                    fail(entry, str(error), error.param)
                    continue
                except Exception as error:  # a fault of ours with this line: its alone
                    fail(entry, f"the request could not be added ({type(error).__name__}: "
                                f"{error})")
                    continue
                queued[f"batch-{entry.line}"] = entry
        while engine.has_unfinished_requests():
            try:
                step()
            except OSError:  # the output cannot be written (a full disk): the run stops
                raise
            except Exception as error:  # the engine itself failed: a rerun resumes
                summary.engine_error = f"{type(error).__name__}: {error}"
                stop_all()
                break
    except KeyboardInterrupt:
        summary.interrupted = True
        stop_all()
    summary.seconds = time.perf_counter() - start
    return summary


def describe(summary: Summary) -> str:
    """The closing line of a run, for stderr."""
    parts = [f"{summary.done} done", f"{summary.failed} failed"]
    if summary.skipped:
        parts.append(f"{summary.skipped} skipped (answered by an earlier run)")
    text = (f"{summary.requests} line{'s' * (summary.requests != 1)}: {', '.join(parts)}; "
            f"{summary.prompt_tokens} prompt tokens ({summary.cached_tokens} from the prefix "
            f"cache), {summary.completion_tokens} completion tokens in {summary.seconds:.1f} s")
    for stopped, why in ((summary.interrupted, "interrupted"),
                         (summary.engine_error, f"the engine failed ({summary.engine_error})")):
        if stopped:
            text += (f"\n{why}: {len(summary.unfinished)} unfinished; rerun the same command "
                     "to finish them")
    return text
