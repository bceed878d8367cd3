"""Building and loading the CPU kernels: the C sources of this package, compiled once per
instruction-set level with the system C compiler into the cache folder and loaded with
ctypes (which releases the GIL), and the choice of the level in use.

Each kernel module declares its C functions' signatures (:func:`declare`) and finds them
through :func:`kernel`. Without a compiler every kernel is None and the modules fall back
to the torch reference, after one warning."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None

from pagedchat import progress
from pagedchat.kernels.quant import EXACT_OFFSETS, FORMATS, INT8_ACTIVATIONS
from pagedchat.machine import usable_cores
from pagedchat.paths import cache_root

log = logging.getLogger("pagedchat.kernels.cpu")
_HERE = Path(__file__).parent

# The C sources, built into one library per level: a new kernel file is one name here.
# Longest to compile first, so that compilers taking them one per core end together.
SOURCES = ("attention.c", "prefill.c", "linear.c", "quant.c", "quant_panels.c", "layer.c",
           "sampling.c", "decoder.c")
# The few-row products on GGML blocks, float and (True) 8-bit, built one format to a library
# (ggml_formats.h's QUANT_FORMATS) when a model first needs them, and handed to a level's library.
PRODUCT_SOURCES = {False: ("quant_rows.c", "quant_split.c"),
                   True: ("quant_int8.c", "quant_int8_tile.c")}
# kernel -> its source, built apart when first asked for: only int8 KV caches call these
APART = {"paged_attention_kv8": "attention_kv8.c", "paged_attention_kv8_part": "attention_kv8.c"}
# calls without a declaration are errors (as in GCC 14); split loops only bloat the tiles
COMPILE_FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11",
                 "-Werror=implicit-function-declaration", "-fno-split-loops"]
# The instruction-set levels the kernels are built for, from the least to the most the CPU
# must have: plain C (x86-64's baseline, or the compiler's default elsewhere), AVX2 with
# FMA, AVX-512 (F, BW, VL, DQ). PAGEDCHAT_CPU_ISA picks one; else the best the CPU runs.
ISAS = ("portable", "avx2", "avx512")
ISA_VARIABLE = "PAGEDCHAT_CPU_ISA"
_ISA_FLAGS = {"portable": [], "avx2": ["-march=x86-64-v3", "-mtune=generic"],
              "avx512": ["-march=x86-64-v4", "-mtune=native", "-mprefer-vector-width=512"]}
# Flags a level adds where the CPU has them (the kernels use them under the compiler's
# macros: __AVXVNNI__, __AVX512BF16__, __AVX512VNNI__), as torch's check or /proc/cpuinfo's
# flag says: AVX-VNNI is 256-bit VNNI without AVX-512 (Intel's cores since Alder Lake).
EXTENSIONS = {"avx2": {"-mavxvnni": "avx_vnni"}, "avx512": {
    "-mavx512bf16": "_is_avx512_bf16_supported", "-mavx512vnni": "_is_vnni_supported"}}
# The C kernels come per element type, named with these suffixes.
_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}
P, INT, INT64, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
# name -> (restype, argtypes) of every C function, declared by the modules that call them
# once, so calls pass plain ints (tensor.data_ptr(), sizes) with no conversions written
# out: at one decoding sequence each call's Python time counts.
_SIGNATURES: dict[str, tuple[object, list]] = {"kernels_isa": (ctypes.c_char_p, [])}
_LOADED: dict[str, ctypes.CDLL | None] = {}  # level -> its library (None: not buildable)
_ON_SWITCH: list[Callable[[], None]] = []  # what set_isa resets


def declare(per_type: dict[str, tuple[object, list]],
            plain: dict[str, tuple[object, list]] | None = None) -> None:
    """Declare C functions: ``per_type`` ones exist once per element type (``name_f32``,
    ``name_bf16``), ``plain`` ones as named."""
    found = {f"{name}_{suffix}": signature for name, signature in per_type.items()
             for suffix in _SUFFIXES.values()}
    _SIGNATURES.update(found | (plain or {}))
    for library in _LOADED.values():
        if library is not None:
            _set_signatures(library, found | (plain or {}))


def on_isa_change(reset: Callable[[], None]) -> None:
    """Call ``reset`` whenever :func:`set_isa` switches the level (a cache that depends on
    the level's kernels)."""
    _ON_SWITCH.append(reset)


@functools.cache
def runnable_isas() -> tuple[str, ...]:
    """The levels of :data:`ISAS` this CPU runs, as CPUID reports them (through torch's
    cpuinfo, which an emulator answers for the CPU it emulates)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ("portable",)
    checks = {"avx2": "_is_avx2_supported", "avx512": "_is_avx512_supported"}
    flags = _cpu_flags().split()
    fallback = {"avx2": {"avx2", "fma", "f16c"} <= set(flags),
                "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags)}
    return ("portable", *(level for level, check in checks.items()
                          if (getattr(torch.cpu, check)() if hasattr(torch.cpu, check)
                              else fallback[level])))


@functools.cache
def chosen_isa() -> str:
    """The level asked for: ``PAGEDCHAT_CPU_ISA`` where the CPU runs it, else the best it
    runs (after one warning line naming the problem)."""
    runnable = runnable_isas()
    wanted = os.environ.get(ISA_VARIABLE, "").strip().lower()
    if not wanted:
        return runnable[-1]
    if wanted not in ISAS:
        log.warning("%s=%s is not one of %s: using %s", ISA_VARIABLE, wanted,
                    ", ".join(ISAS), runnable[-1])
        return runnable[-1]
    if wanted not in runnable:
        log.warning("%s=%s: this CPU cannot run it (it runs %s): using %s", ISA_VARIABLE,
                    wanted, ", ".join(runnable), runnable[-1])
        return runnable[-1]
    return wanted


_active_isa: list[str] = []  # set_isa's choice, for this process


def set_isa(level: str | None) -> None:
    """Use the kernels built for ``level`` (one of :func:`runnable_isas`; None: the one
    :func:`chosen_isa` picks) from now on, in this process; the tests run every level this
    way. Each level checks oneDNN's layouts with its own product again: weights packed
    before go to oneDNN's product; a decoder stack built before keeps its kernels."""
    if level is not None and level not in runnable_isas():
        raise ValueError(f"this CPU cannot run the {level!r} kernels "
                         f"(it runs {', '.join(runnable_isas())})")
    _active_isa[:] = [] if level is None else [level]
    _FUNCTIONS.clear()
    for reset in _ON_SWITCH:
        reset()


def isa() -> str:
    """The level of the C kernels in use (``portable``, ``avx2``, ``avx512``), or ``none``
    where none could be built (the backend then runs the torch reference)."""
    library = kernel_library()
    return "none" if library is None else library.kernels_isa().decode()


def kernel_library(level: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels of ``level`` (by default the one in use), built on first use
    and cached; a level that cannot be built falls back to the next one down, with a
    warning; None where none can be built."""
    if level is None:
        level = _active_isa[0] if _active_isa else chosen_isa()
    return _library(level)


def prepare(kernel_types: Iterable[int] = ()) -> None:
    """Build the kernels in use, and the products these C kernels' type numbers ask for, each on a
    thread of its own where the cache lacks it, and return at once: a first start's compile then
    overlaps what the caller does next (loading the model); a kernel called meanwhile waits."""
    flags = _flags(_active_isa[0] if _active_isa else chosen_isa())
    for job, args in [(kernel_library, ()),
                      *((products_library, (flags, kind)) for kind in set(kernel_types))]:
        threading.Thread(target=job, args=args, name="pagedchat-kernel-build", daemon=True).start()


# one build at a time (re-entered where a level falls back to the next one down); a caller
# waits for the one under way
_building = threading.RLock()


def _library(level: str) -> ctypes.CDLL | None:
    if level not in _LOADED:
        with _building:
            if level not in _LOADED:
                _LOADED[level] = build_level(level)
    return _LOADED[level]


def build_level(level: str) -> ctypes.CDLL | None:
    """``level``'s library, built now unless the cache has it, for this process's flags
    (tests build a level as another CPU would); a level that cannot be built falls back to
    the next one down. :func:`kernel_library` keeps one per level."""
    if _compiler() is None:
        log.warning("no C compiler found: using the (slower) torch reference kernels")
        return None
    try:
        library = _built(f"cpu_kernels-{level}", [_HERE / name for name in SOURCES],
                         _flags(level), f"the C kernels for this CPU ({level})")
    except (OSError, AttributeError, subprocess.CalledProcessError) as error:
        lower = ISAS[ISAS.index(level) - 1] if level != ISAS[0] else None
        detail = getattr(error, "stderr", b"") or b""
        log.warning("could not build or load the %s CPU kernels (%s%s): using %s", level,
                    error, f": {detail.decode(errors='replace').strip().splitlines()[0]}"
                    if detail.strip() else "", lower or "the torch reference")
        return None if lower is None else _library(lower)
    return library


@functools.cache
def plain_library(*sources: Path, flags: tuple[str, ...] = ("-O2", "-fPIC", "-std=c11"),
                  name: str = "") -> ctypes.CDLL | None:
    """``sources`` (the headers beside them included) as plain C, or with ``flags`` (a level's
    library's), once into the cache folder like the kernels, and loaded, as ``name`` (by default
    the first source's); None where they cannot be built (after a warning)."""
    name = name or sources[0].stem
    try:
        return _built(name, list(sources), flags, f"{name} for this CPU")
    except (OSError, subprocess.CalledProcessError) as error:
        log.warning("could not build or load %s (%s)", name, error)
        return None


def products_library(flags: tuple[str, ...], kernel_type: int) -> ctypes.CDLL | None:
    """The products a C kernels' type number asks for (its format's, float or 8-bit), as
    :func:`plain_library` builds them with ``flags`` (a level's library's); None also where there
    is no compiler or the type is unknown."""
    int8 = bool(kernel_type & INT8_ACTIVATIONS)
    type_id = kernel_type & ~(INT8_ACTIVATIONS | EXACT_OFFSETS)
    name = next((f.name for f in FORMATS.values() if f.type_id == type_id), None)
    if _compiler() is None or name is None:
        return None
    return plain_library(*(_HERE / source for source in PRODUCT_SOURCES[int8]),
                         flags=(*flags, f"-DQUANT_FORMATS(F)=F({name})"),
                         name=f"products-{name}{'-int8' * int8}")


def load_products(kernel_types: Iterable[int], library: ctypes.CDLL | None = None) -> bool:
    """Hand ``library`` (a level's kernels; by default those in use) the products these type
    numbers ask for (:func:`products_library`), built with its flags; whether it has them all."""
    library = library or kernel_library()
    for kernel_type in set(kernel_types):
        if (products := products_library(library.build_flags, kernel_type)) is None:
            return False
        functions = ((products.quant8_rows_part, products.quant8_tile_part)
                     if kernel_type & INT8_ACTIVATIONS else (products.quant_rows_part, None))
        if library.set_products(kernel_type, *functions) != 0:
            return False
    return True


def _built(name: str, sources: list[Path], flags: tuple[str, ...], what: str) -> ctypes.CDLL:
    """``sources`` (with the headers beside them) compiled with ``flags`` into one library in
    the cache folder, unless it is there already, and loaded (its ``build_flags``: ``flags``)."""
    compiler = _compiler() or "cc"
    headers = sorted(sources[0].parent.glob("*.h"))
    identity = "|".join([*(file.read_text() for file in sources + headers), compiler, *flags,
                         platform.machine(), _cpu_flags()])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"{name}-{digest}.so"
    if not target.is_file():
        with progress.task(f"compiling {what}, once", len(sources) + 1) as advance, \
                _one_builder(target):
            if not target.is_file():  # not built by the process this one waited for
                _build(compiler, flags, target, advance, sources)
    library = _set_signatures(ctypes.CDLL(str(target)), _SIGNATURES)
    library.build_flags = flags
    return library


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _flags(level: str) -> tuple[str, ...]:
    """The compiler's flags for ``level``'s kernels on this CPU."""
    return (*COMPILE_FLAGS, *_ISA_FLAGS[level], *extensions_added(level))


def extensions_added(level: str) -> list[str]:
    """The flags of ``level``'s :data:`EXTENSIONS` that this CPU has."""
    return [flag for flag, check in EXTENSIONS.get(level, {}).items()
            if (getattr(torch.cpu, check, bool)() if check.startswith("_is_")
                else check in _cpu_flags().split())]


def _set_signatures(library: ctypes.CDLL, signatures: dict) -> ctypes.CDLL:
    for name, (restype, argtypes) in signatures.items():
        if (function := getattr(library, name, None)) is not None:  # APART's are apart
            function.restype, function.argtypes = restype, argtypes
    return library


@contextlib.contextmanager
def _one_builder(target: Path) -> Iterator[None]:
    """Held while ``target`` is built: processes starting together on a fresh cache (the
    chat and a server, test workers) wait for one compiler run instead of each running
    their own. Where the OS has no ``flock`` each builds; the rename keeps that safe."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _build(compiler: str, flags: tuple[str, ...], target: Path, advance: progress.Advance,
           sources: list[Path]) -> None:
    """Compile every source, one compiler per core at a time (more only share the cores and their
    caches), then link; ``advance`` is called once per compiled source and once for the link.
    Called inside :func:`_one_builder`, which made ``target``'s folder."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in sources]
        lib = Path(tmp) / "kernels.so"
        # -ffast-math only when compiling: linking with it would set flush-to-zero for
        # the whole process (crtfastmath), changing torch's own numerics.
        def compile_one(source: Path, obj: Path) -> None:
            subprocess.run([compiler, *flags, "-c", str(source), "-o", str(obj)], check=True,
                           capture_output=True)

        with ThreadPoolExecutor(usable_cores()) as pool:
            for done in as_completed([pool.submit(compile_one, source, obj)
                                      for source, obj in zip(sources, objects, strict=True)]):
                done.result()  # a compiler's error, raised here
                advance(1)
        subprocess.run([compiler, "-shared", "-fopenmp", *map(str, objects), "-o", str(lib),
                        "-lm"], check=True, capture_output=True)
        advance(1)
        os.replace(lib, target)


def _cpu_flags() -> str:
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next((line for line in lines if line.startswith("flags")), platform.processor())
    return platform.processor()


def kernel(name: str, *tensors: torch.Tensor | None):
    """The C kernel ``name`` for these tensors' element type (float32 or bfloat16, the same
    for all, on the CPU; None stands for an absent optional tensor, never the first), else
    None (also where the kernel has no version for that type)."""
    dtype = tensors[0].dtype
    for tensor in tensors:
        if tensor is not None and (tensor.dtype != dtype or not tensor.is_cpu):
            return None
    return typed_kernel(name, dtype)


# (name, dtype) -> the active library's C function, or None; emptied by set_isa
_FUNCTIONS: dict[tuple[str, torch.dtype], object] = {}


def typed_kernel(name: str, dtype: torch.dtype):
    key = (name, dtype)
    if key not in _FUNCTIONS:
        suffix = _SUFFIXES.get(dtype)
        function = f"{name}_{suffix}"
        library = kernel_library() if suffix is not None and function in _SIGNATURES else None
        if library is not None and name in APART:  # built apart, at the level in use
            library = plain_library(_HERE / APART[name], flags=library.build_flags)
        _FUNCTIONS[key] = None if library is None else getattr(library, function)
    return _FUNCTIONS[key]
