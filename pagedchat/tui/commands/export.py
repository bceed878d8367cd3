"""/export [PATH.md]: write the session as Markdown and, beside it, as JSON."""

from __future__ import annotations

from pathlib import Path

from pagedchat.chat import export as formats
from pagedchat.tui.commands.registry import CommandHost, command


@command("/export [PATH.md]", "write this session as Markdown and JSON")
async def export(app: CommandHost, argument: str) -> bool:
    session = app.session
    default = app.store.path.parent / "exports" / f"session-{session.id}.md"
    markdown_path = Path(argument).expanduser() if argument else default
    json_path = markdown_path.with_suffix(".json")  # beside it, the same name
    try:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(formats.to_markdown(session), encoding="utf-8")
        json_path.write_text(formats.to_json(session), encoding="utf-8")
    except OSError as error:
        app.notify(str(error), title="Could not export", severity="error")
        return False
    app.notify(f"{markdown_path}\n{json_path}", title="Exported")
    return True
