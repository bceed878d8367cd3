"""Where pagedchat keeps files it can rebuild (converted models, compiled kernels), and how
it writes a file that readers must never see half written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def cache_root() -> Path:
    """``$PAGEDCHAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedchat`` (``~/.cache/pagedchat``)."""
    if os.environ.get("PAGEDCHAT_CACHE_DIR"):
        return Path(os.environ["PAGEDCHAT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pagedchat"


@contextmanager
def staged_file(target: Path, mode: str, suffix: str = "") -> Iterator[IO]:
    """A new file beside ``target`` (named ``.<target's name>-<random><suffix>``) that takes
    its place when the block ends without an error, and is removed otherwise."""
    handle, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-", suffix=suffix)
    try:
        with os.fdopen(handle, mode) as out:
            yield out
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
