"""Compile the CPU kernels (and those built apart) of every level this CPU runs besides the
one in use, and the avx2 and avx512 levels without the extensions this CPU adds to them (as
``tests/kernels/test_quant.py`` builds them), then move each library into the kernel cache
folder given. The suite starts this at the lowest priority when it starts: the compilers
take the cores the tests leave idle, and the tests of those levels find them built.

It builds in a cache of its own (``PAGEDCHAT_CACHE_DIR``, which the suite removes after
stopping it), so that stopping it at any moment leaves nothing half written in the real one.

    PAGEDCHAT_CACHE_DIR=PRIVATE python -m tests.prebuild_kernels KERNEL_CACHE_FOLDER
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pagedchat.kernels.cpu import build
from pagedchat.paths import cache_root


def main(target: Path) -> None:
    os.nice(19)
    builds = [(level, False) for level in reversed(build.runnable_isas())
              if level != build.chosen_isa()]
    builds += [(level, True) for level in ("avx512", "avx2")
               if level in build.runnable_isas() and build.extensions_added(level)]
    extensions = build.EXTENSIONS
    for level, plain in builds:
        build.EXTENSIONS = {**extensions, level: {}} if plain else extensions
        build.build_level(level)
        for source in set(build.APART.values()):  # what the tests of int8 caches ask for
            build.plain_library.__wrapped__(Path(build.__file__).with_name(source), level)
        for library in (cache_root() / "kernels").glob("*.so"):
            os.replace(library, target / library.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
