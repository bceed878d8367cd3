"""The errors a user can meet, each naming what was wrong."""


class PagedChatError(Exception):
    """Base class for every error pagedchat reports to a user."""


class ModelLoadError(PagedChatError):
    """The model could not be found or read (missing path, not a model, truncated file...)."""


class RequestError(PagedChatError, ValueError):
    """A request that can never be served (bad parameters, too long, larger than the pool)."""


class WorkerError(PagedChatError):
    """A tensor-parallel worker process died or failed; the engine cannot go on."""
