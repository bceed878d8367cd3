"""A session as Markdown (to read) or JSON (to process)."""

from __future__ import annotations

import json
from dataclasses import asdict

from pagedchat.chat.conversation import Session

_MARKS = {"cancelled": " (cancelled)", "interrupted": " (interrupted)", "error": " (failed)",
          "unanswered": " (no reply)", "looped": " (stopped: repeating itself)"}


def to_markdown(session: Session) -> str:
    lines = [f"# {session.title}", ""]
    if session.system_prompt:
        lines += ["> **System:** " + session.system_prompt.replace("\n", "\n> "), ""]
    for message in session.messages:
        who = "You" if message.role == "user" else "Assistant"
        lines += [f"## {who}{_MARKS.get(message.status, '')}", "", message.content, ""]
        if message.error:
            lines += [f"*{message.error}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(session: Session) -> str:
    data = asdict(session)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
