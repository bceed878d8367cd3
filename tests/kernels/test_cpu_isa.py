"""Which instruction-set level of the CPU kernels runs: the best the CPU reports, or the one
PAGEDCHAT_CPU_ISA asks for, with one warning line where it cannot be had."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagedchat.kernels import cpu
from pagedchat.kernels.cpu import build

pytestmark = pytest.mark.skipif(cpu.kernel_library() is None, reason="no C compiler")


def choose(monkeypatch, value: str | None, runnable: tuple[str, ...]) -> str:
    monkeypatch.setattr(build, "runnable_isas", lambda: runnable)
    if value is None:
        monkeypatch.delenv(build.ISA_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(build.ISA_VARIABLE, value)
    return build.chosen_isa.__wrapped__()


def test_each_level_this_cpu_runs_has_its_own_library():
    levels = build.runnable_isas()
    assert levels[0] == "portable" and set(levels) <= set(build.ISAS)
    libraries = {level: cpu.kernel_library(level) for level in levels}
    for level, library in libraries.items():
        assert library.kernels_isa().decode() == level
    assert len({id(library) for library in libraries.values()}) == len(levels)
    assert cpu.isa() in levels


def test_the_best_level_is_picked_and_the_switch_forces_one(monkeypatch, caplog):
    everything = ("portable", "avx2", "avx512")
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        assert choose(monkeypatch, None, everything) == "avx512"
        assert choose(monkeypatch, None, ("portable", "avx2")) == "avx2"
        assert choose(monkeypatch, "portable", everything) == "portable"
        assert choose(monkeypatch, " AVX2 ", everything) == "avx2"
    assert not caplog.records


@pytest.mark.parametrize(("value", "problem"), [("avx512", "this CPU cannot run it"),
                                                ("sse9", "is not one of portable")])
def test_a_level_that_cannot_be_had_warns_once_and_takes_the_best(monkeypatch, caplog, value,
                                                                  problem):
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        assert choose(monkeypatch, value, ("portable", "avx2")) == "avx2"
    assert len(caplog.records) == 1
    assert problem in caplog.records[0].getMessage()
    assert build.ISA_VARIABLE in caplog.records[0].getMessage()


def test_set_isa_refuses_a_level_the_cpu_cannot_run(monkeypatch):
    monkeypatch.setattr(build, "runnable_isas", lambda: ("portable",))
    with pytest.raises(ValueError, match="cannot run the 'avx2' kernels"):
        cpu.set_isa("avx2")


def test_a_level_that_cannot_be_built_falls_back_one_line_each(monkeypatch, caplog):
    """A compiler that fails every file: avx2 falls back to portable, portable to the torch
    reference, one warning line each, no traceback."""
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        assert build._library("avx2") is None
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert "avx2 CPU kernels" in lines[0] and lines[0].endswith("using portable")
    assert "portable CPU kernels" in lines[1] and lines[1].endswith("the torch reference")


def test_prepare_builds_ahead_and_a_kernel_call_waits_for_that_build(monkeypatch):
    """``prepare`` returns while the build runs on its own thread; a kernel asked for
    meanwhile waits for that build rather than starting a second one."""
    started, release, built = threading.Event(), threading.Event(), []

    def slow_build(level: str) -> str:
        built.append(level)
        started.set()
        release.wait(10)
        return f"library of {level}"

    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "build_level", slow_build)
    build.prepare()
    assert started.wait(10)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(build.kernel_library)
        release.set()
        assert waiting.result(10) == f"library of {built[0]}"
    assert len(built) == 1


def test_two_starts_on_an_empty_cache_compile_once(monkeypatch, tmp_path):
    """Two builds of one level at once (the chat and a server starting on a fresh cache):
    the second waits for the first's lock and loads its library; the compiler runs once."""
    level = build.chosen_isa()
    compiled = build.kernel_library(level)._name
    compiles = []

    def slow_build(compiler, flags, target, advance, sources) -> None:
        compiles.append(target)
        time.sleep(0.5)
        part = target.with_name(f"{target.name}.{len(compiles)}")
        shutil.copy(compiled, part)
        os.replace(part, target)  # as the real build renames its library into place

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_build", slow_build)
    with ThreadPoolExecutor(2) as pool:
        libraries = list(pool.map(build.build_level, [level, level]))
    assert len(compiles) == 1
    assert all(library.kernels_isa().decode() == level for library in libraries)


def test_int8_cache_attention_is_built_apart_at_the_level_in_use_on_first_use(monkeypatch,
                                                                               tmp_path):
    """A first start compiles no int8-cache attention (build.APART): the kernels' library
    lacks it, and the first lookup builds attention_kv8.c into a library of its own, with
    the level's flags, whose functions carry their signatures."""
    import torch

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_FUNCTIONS", {})
    build.plain_library.cache_clear()
    library = build.kernel_library()
    assert not hasattr(library, "paged_attention_kv8_f32")
    assert not list((tmp_path / "kernels").glob("attention_kv8-*.so"))
    for dtype in (torch.float32, torch.bfloat16):
        whole = build.typed_kernel("paged_attention_kv8", dtype)
        part = build.typed_kernel("paged_attention_kv8_part", dtype)
        assert whole is not None and part is not None and whole.restype is build.INT
    apart = build.plain_library(build.Path(build.__file__).with_name("attention_kv8.c"),
                                flags=library.build_flags)
    assert [file.name for file in (tmp_path / "kernels").glob("attention_kv8-*.so")] == [
        build.Path(apart._name).name]
    assert build.typed_kernel("paged_attention_kv8", torch.float32) is not None
    build.plain_library.cache_clear()
