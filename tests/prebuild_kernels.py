"""Compile every format's products for the level in use, and the CPU kernels (those built
apart and every format's products included) of every level this CPU runs besides that one, and
the avx2 and avx512 levels without the extensions this CPU adds to them (as
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
from pagedchat.kernels.quant import FORMATS
from pagedchat.paths import cache_root


def main(target: Path) -> None:
    os.nice(19)
    builds = [(build.chosen_isa(), False)]  # only its products: the suite builds its library
    builds += [(level, False) for level in reversed(build.runnable_isas())
               if level != build.chosen_isa()]
    builds += [(level, True) for level in ("avx512", "avx2")
               if level in build.runnable_isas() and build.extensions_added(level)]
    extensions = build.EXTENSIONS
    for level, plain in builds:
        build.EXTENSIONS = {**extensions, level: {}} if plain else extensions
        for fmt in FORMATS.values():  # what the tests of every format's products ask for
            for int8 in (False, True):
                build.products_library(build._flags(level),
                                       fmt.type_id | (build.INT8_ACTIVATIONS if int8 else 0))
        if level != build.chosen_isa():
            build.build_level(level)
            for source in set(build.APART.values()):  # what the tests of int8 caches ask for
                build.plain_library(Path(build.__file__).with_name(source),
                                    flags=build._flags(level))
        for library in (cache_root() / "kernels").glob("*.so"):
            os.replace(library, target / library.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
