"""The output file of ``pagedchat batch``: records appended one per line, read back to resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import IO


class BatchError(ValueError):
    """The batch cannot go on as asked; the message says why and what to do."""


def key(request_id: object) -> str:
    """Ids compare by their JSON form, so 1 and "1" stay different ids."""
    return json.dumps(request_id, sort_keys=True)


def write_record(sink: IO[str], record: dict[str, object]) -> None:
    """Append one record as one line and flush it, so that a kill loses at most this line."""
    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    sink.flush()


def load_done(path: Path) -> list[dict[str, object]]:
    """The answer records in the output file ``path``, for a rerun to skip their requests.
    The file keeps only those: error records, repeated answers, blank lines and a last line
    cut short by a kill are taken out at once (a kill leaves the old file or the new one). Any
    other line that is no record of ``pagedchat batch`` is BatchError, before anything changes."""
    if not path.is_file():  # nothing written yet, or a device or pipe: nothing to resume
        return []
    data = path.read_bytes()
    raws = data.split(b"\n")
    kept: list[bytes] = []
    answers: list[dict[str, object]] = []
    seen: set[tuple[object, str]] = set()
    # a last line without its newline is rewritten with one, or dropped when cut short
    changed = not data.endswith(b"\n") and bool(data)
    for number, raw in enumerate(raws, 1):
        if not raw.strip():
            changed |= number < len(raws)
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's reach
            if number == len(raws) and b'{"id": '.startswith(raw[:7]):  # a record cut short
                continue
            raise BatchError(f"{path}: line {number} is not JSON; is this the output file of "
                             "pagedchat batch?") from None
        if (kind := _kind(record)) is None:
            raise BatchError(f"{path}: line {number} is neither an answer nor an error record "
                             "of pagedchat batch; is this its output file?")
        seen_key = (record.get("line"), key(record["id"]))
        if kind == "error" or seen_key in seen:
            changed = True
            continue
        seen.add(seen_key)
        kept.append(raw)
        answers.append(record)
    if changed:
        _replace(path, b"".join(raw + b"\n" for raw in kept))
    return answers


def _kind(record: object) -> str | None:
    if not isinstance(record, dict) or "id" not in record:
        return None
    return "error" if "error" in record else "answer" if "text" in record else None


def _replace(path: Path, content: bytes) -> None:
    """Put ``content`` in place of ``path`` in one rename (through a symlink to its target)."""
    target = path.resolve()
    temp = target.with_name(f".{target.name}.resume")
    with open(temp, "wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    shutil.copymode(target, temp)
    os.replace(temp, target)
