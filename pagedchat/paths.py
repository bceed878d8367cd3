"""Where pagedchat keeps files it can rebuild (converted models, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PAGEDCHAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedchat`` (``~/.cache/pagedchat``)."""
    if os.environ.get("PAGEDCHAT_CACHE_DIR"):
        return Path(os.environ["PAGEDCHAT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pagedchat"
