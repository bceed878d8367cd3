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
    """Where ``value`` (a string, or JSON's lists and objects of them, nested to any depth)
    holds what no tokenizer encodes, a lone UTF-16 surrogate (JSON's ``"\\ud800"``, or bytes
    a command line could not decode): the string's path (``messages.0.content``) and a
    message naming it; None where every string is Unicode text."""
    pending = [(path, value)]  # a stack, not recursion: a body may nest thousands deep
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                named = f"{where}: " if where else ""
                return where, (f"{named}the text is not valid Unicode (a lone surrogate "
                               f"U+{ord(item[error.start]):04X} at character {error.start})")
            continue
        items = (item.items() if isinstance(item, dict)
                 else enumerate(item) if isinstance(item, list) else ())
        # reversed onto the stack: the first string in reading order is the one named
        pending.extend((f"{where}.{key}" if where else str(key), inner)
                       for key, inner in reversed(list(items)))
    return None
