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
