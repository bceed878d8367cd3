"""``pagedchat batch``: JSONL requests in, JSONL results out, continuously batched.

Every valid line goes into the engine at once; each result is appended and flushed the
moment its request finishes, so a run killed at any point loses nothing finished. A rerun
with the same output file skips every id already there (results and error records alike:
each id appears exactly once; delete an error record to retry its line).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pagedchat.chat.prompt import render
from pagedchat.engine.errors import RequestError
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams

SAMPLING_FIELDS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "best_of", "stop",
    "stop_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "use_beam_search", "length_penalty", "early_stopping"})
PROMPT_FIELDS = frozenset({"id", "prompt", "messages"})


class LineError(ValueError):
    """A line that cannot become a request; ``id`` is its own or its line number."""

    def __init__(self, request_id: object, reason: str) -> None:
        super().__init__(reason)
        self.request_id = request_id


@dataclass
class Job:
    request_id: object
    line: int
    prompt: str | list[int]
    params: SamplingParams


@dataclass
class Summary:
    requests: int = 0
    skipped: int = 0  # already in the output file
    done: int = 0
    failed: int = 0
    failed_before: int = 0  # error records left by an earlier run, for ids of this input
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    unfinished: list[object] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.failed or self.failed_before else 0


def key(request_id: object) -> str:
    """Ids compare by their JSON form, so 1 and "1" stay different ids."""
    return json.dumps(request_id, sort_keys=True)


def parse_line(text: str, line: int, tokenizer, system: str | None,
               defaults: dict[str, object]) -> Job:
    """One input line -> a Job, or LineError naming what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LineError(line, f"malformed JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, dict):
        raise LineError(line, "a line must be a JSON object")
    request_id = data.get("id", line)
    if request_id is None or isinstance(request_id, (dict, list)):
        raise LineError(line, "id must be a string or a number")
    unknown = sorted(set(data) - PROMPT_FIELDS - SAMPLING_FIELDS)
    if unknown:
        raise LineError(request_id, f"unknown field {unknown[0]!r}")
    if ("prompt" in data) == ("messages" in data):
        raise LineError(request_id, "give exactly one of 'prompt' or 'messages'")
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise LineError(request_id, "'prompt' must be a non-empty string")
        prompt: str | list[int] = f"{system}\n\n{data['prompt']}" if system else data["prompt"]
    else:
        prompt = render(tokenizer, _messages(request_id, data["messages"], system))
    fields = {**defaults, **{k: v for k, v in data.items() if k in SAMPLING_FIELDS}}
    try:
        params = SamplingParams(**fields)
    except (RequestError, TypeError) as error:
        raise LineError(request_id, str(error)) from None
    return Job(request_id, line, prompt, params)


def _messages(request_id: object, messages: object, system: str | None) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise LineError(request_id, "'messages' must be a non-empty list")
    for message in messages:
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise LineError(request_id, "each message needs a string 'role' and 'content'")
    if system and messages[0]["role"] != "system":
        return [{"role": "system", "content": system}, *messages]
    return messages


def load_done(path: Path) -> dict[str, bool]:
    """Ids already in an output file -> whether their record is an error. A last line cut
    short by a kill is removed so that appending starts on a fresh line."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    done: dict[str, bool] = {}
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "id" in record:
            done[key(record["id"])] = "error" in record
    return done


def result_record(request_id: object, out: RequestOutput) -> dict[str, object]:
    texts = [c.text for c in out.outputs]
    reasons = [c.finish_reason for c in out.outputs]
    single = len(out.outputs) == 1
    return {
        "id": request_id,
        "text": texts[0] if single else texts,
        "finish_reason": reasons[0] if single else reasons,
        "usage": {"prompt_tokens": len(out.prompt_token_ids),
                  "completion_tokens": sum(len(c.token_ids) for c in out.outputs),
                  "cached_tokens": out.num_cached_tokens},
    }


def run_batch(engine: LLMEngine, lines: Iterable[str], sink: IO[str], done: dict[str, bool],
              system: str | None = None, defaults: dict[str, object] | None = None,
              warn: Callable[[str], None] = print,
              progress: Callable[[int], None] | None = None) -> Summary:
    """Run every line not already in ``done``; write one record per line to ``sink``.

    Requests admitted together share their common prefix (the system prompt, the chat
    template): the engine makes blocks findable as soon as they are scheduled."""
    start = time.perf_counter()
    summary = Summary()
    queued: dict[str, Job] = {}

    def write(record: dict[str, object]) -> None:
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        sink.flush()
        if progress is not None:
            progress(1)

    def fail(request_id: object, line: int, reason: str) -> None:
        summary.failed += 1
        warn(f"line {line}: {reason}")
        write({"id": request_id, "line": line, "error": reason})

    def step() -> None:
        for out in engine.step():
            if out.finished:
                record = result_record(queued.pop(out.request_id).request_id, out)
                summary.done += 1
                summary.prompt_tokens += len(out.prompt_token_ids)
                summary.cached_tokens += out.num_cached_tokens
                summary.completion_tokens += record["usage"]["completion_tokens"]
                write(record)

    try:
        for job in _new_jobs(lines, engine.tokenizer, system, defaults or {}, done, summary,
                             fail, progress):
            try:
                engine.add_request(f"batch-{job.line}", job.prompt, job.params)
            except RequestError as error:
                fail(job.request_id, job.line, str(error))
                continue
            queued[f"batch-{job.line}"] = job
        while engine.has_unfinished_requests():
            step()
    except KeyboardInterrupt:
        summary.interrupted = True
        for request_id, job in queued.items():
            engine.abort_request(request_id)
            summary.unfinished.append(job.request_id)
    summary.seconds = time.perf_counter() - start
    return summary


def _new_jobs(lines: Iterable[str], tokenizer, system: str | None, defaults: dict[str, object],
              done: dict[str, bool], summary: Summary, fail: Callable[[object, int, str], None],
              progress: Callable[[int], None] | None) -> Iterator[Job]:
    """The valid lines whose ids are not in ``done``; the others are failed or skipped."""
    seen: dict[str, int] = {}
    for line, text in enumerate(lines, 1):
        if not text.strip():
            continue
        summary.requests += 1
        try:
            job = parse_line(text, line, tokenizer, system, defaults)
            request_id, reason = job.request_id, None
        except LineError as error:
            request_id, reason = error.request_id, str(error)
        job_key = key(request_id)
        if reason is None and job_key in seen:
            reason = f"duplicate id (first on line {seen[job_key]})"
        seen.setdefault(job_key, line)
        if job_key in done:
            summary.skipped += 1
            summary.failed_before += done[job_key]
            if progress is not None:
                progress(1)
        elif reason is not None:
            fail(request_id, line, reason)
        else:
            yield job


def describe(summary: Summary) -> str:
    """The closing line of a run, for stderr."""
    parts = [f"{summary.done} done", f"{summary.failed} failed"]
    if summary.skipped:
        parts.append(f"{summary.skipped} skipped (already in the output"
                     + (f", {summary.failed_before} of them errors" if summary.failed_before
                        else "") + ")")
    text = (f"{summary.requests} lines: {', '.join(parts)}; {summary.prompt_tokens} prompt "
            f"tokens ({summary.cached_tokens} from the prefix cache), "
            f"{summary.completion_tokens} completion tokens in {summary.seconds:.1f} s")
    if summary.interrupted:
        text += (f"\ninterrupted: {len(summary.unfinished)} unfinished; rerun the same command "
                 "to finish them")
    return text
