"""The errors a user can meet, each naming what was wrong."""


class PagedChatError(Exception):
    """Base class for every error pagedchat reports to a user."""


class ModelLoadError(PagedChatError):
    """The model could not be found or read (missing path, not a model, truncated file...)."""


class RequestError(PagedChatError, ValueError):
    """A request that can never be served (bad parameters, too long, larger than the pool).
    ``param`` names the field at fault where one is (``"top_k"``, ``"stop_token_ids"``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class WorkerError(PagedChatError):
    """A tensor-parallel worker process died or failed; the engine cannot go on."""


def invalid_text(value: object, path: str = "") -> tuple[str, str] | None:
    """The path (``messages.0.content``) and a message naming it, of the first string in
    ``value`` (JSON, any depth) with a lone surrogate (JSON's ``"\\ud800"``, undecodable bytes)."""
    pending = [(path, value)]  # a stack: a body may nest deeper than Python recurses
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError as error:
                return where, (f"{where}: " if where else "") + (
                    f"the text is not valid Unicode (a lone surrogate "
                    f"U+{ord(item[error.start]):04X} at character {error.start})")
        elif isinstance(item, (dict, list)):  # pushed reversed: the first found is named
            keys = list(item if isinstance(item, dict) else range(len(item)))
            pending.extend((f"{where}.{k}" if where else str(k), item[k]) for k in keys[::-1])
    return None
