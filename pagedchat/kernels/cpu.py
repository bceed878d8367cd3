"""The CPU backend: a compiled paged-attention kernel for decode and short chunks, a
compiled tiled kernel for longer prompt chunks (torch's SDPA without AVX-512), a
compiled pass over the logits for sampling, compiled RMSNorm,
rotary-and-store and SiLU-and-multiply (float32 and bfloat16), linear layers on weights
packed once into oneDNN's layout (a compiled product reads that layout for up to 256 rows,
oneDNN's own product takes the rest; a tied head is packed too, and the embedding reads
its rows from that layout), a small decode batch through all the layers in one compiled
call, the reference for everything else.

The C kernels (``cpu_*.c``) are built once per machine with the system C compiler into
the cache folder and loaded with ctypes (which releases the GIL). Without a compiler the
backend falls back to the torch reference, with a warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pagedchat.kernels import reference
from pagedchat.kernels.reference import copy_blocks, gather_kv, swap_blocks, write_slots
from pagedchat.paths import cache_root

__all__ = ["DecoderStack", "LayerTensors", "copy_blocks", "decoder_stack", "embedding",
           "kernel_library", "linear", "max_logsumexp", "pack_embedding", "pack_linear",
           "paged_attention", "quantized_embedding", "quantized_linear", "rms_norm",
           "rotary_store", "silu_mul", "store_kv", "swap_blocks"]

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name)
           for name in ("cpu_attention.c", "cpu_prefill.c", "cpu_sampling.c", "cpu_layer.c",
                        "cpu_linear.c", "cpu_decoder.c", "cpu_quant.c")]
HEADERS = [Path(__file__).with_name(name) for name in ("cpu_vector.h", "cpu_kernels.h")]
COMPILE_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp",
                 "-fPIC", "-std=c11"]
# Chunks of at least this many queries go to the chunked-prefill kernel, which reads each
# tile of K and V once for 24 query rows (from 8 rows on it beats the row-by-row kernel;
# 1,000 rows: 2.8x torch's SDPA on AMD Zen 5) ...
PREFILL_MIN_QUERY_LEN = 8
# ... or, where that kernel is not built (no AVX-512), from 25 to SDPA, whose blocked
# matmuls beat the row-by-row kernel there.
SDPA_MIN_QUERY_LEN = 25
# On a plain weight (a tied head whose packing the C product cannot read), up to 16 rows
# the C product, which reads each weight once, beats torch's BLAS on this model's shapes
# (a decode step at batch 4: 1.55x, 8: 1.68x, 16: 1.23x; one row: 2.9x on AMD Zen 5,
# where MKL's matrix-vector product reads 15 GB/s of 45) and oneDNN on plain weights (16
# rows: 1.5x); past 16 oneDNN's blocked product pays.
LINEAR_ROWS = range(1, 17)
# On a packed weight, up to 256 rows (a decode step at the default max_num_seqs) the C
# product on oneDNN's blocked layout, and with it the one-call decoder stack. Product
# alone, it beats oneDNN's own from 1 to 64 rows (float32: 1.14-1.21x on this model's
# layer weights, AMD Zen 5) and is even with it past 128; but whole steps gain: the
# 200-request ShareGPT run, builds alternated in one process, took 256 rows over 64 at
# 1.06x (float32) and 1.09x (bfloat16), 128 at 0.93x of 256, 1,024 even with 256.
BLOCKED_ROWS = range(1, 257)
# The C kernels come per element type, named with these suffixes.
_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _INT, _INT64, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
# Declared once, so calls pass plain ints (tensor.data_ptr(), sizes) with no conversions
# written out: at one decoding sequence each call's Python time counts.
_PER_TYPE_SIGNATURES = {
    "paged_attention": (_INT, [_P] * 9 + [_INT] * 6 + [_FLOAT, _INT]),
    "paged_prefill": (_INT, [_P] * 8 + [_INT] * 6 + [_FLOAT, _INT]),
    "rms_norm": (None, [_P] * 5 + [_INT, _INT, _FLOAT, _INT]),
    "rotary_store": (None, [_P, _INT64] + [_P] * 6 + [_INT] * 5),
    "silu_mul": (None, [_P, _P, _INT, _INT, _INT]),
    "linear_blocked": (None, [_P] * 4 + [_INT] * 5),
    "embedding_blocked": (None, [_P] * 3 + [_INT] * 4),
    "decoder_layers": (_INT, [_P, _INT, _P, _P, _P]),
    "max_logsumexp": (None, [_P, _INT, _INT, _INT64, _P, _P, _P, _INT]),
}
_SIGNATURES = {
    **{f"{name}_{suffix}": signature for name, signature in _PER_TYPE_SIGNATURES.items()
       for suffix in _SUFFIXES.values()},
    "paged_prefill_vectorised": (_INT, []),
    "linear_f32": (None, [_P] * 4 + [_INT] * 4),
    "linear_f32_vectorised": (_INT, []),
}


@functools.cache
def kernel_library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use and cached; None if they cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: using the (slower) torch reference attention")
        return None
    identity = "|".join([*(path.read_text() for path in SOURCES + HEADERS), compiler,
                         *COMPILE_FLAGS, platform.machine(), _cpu_flags()])
    target = cache_root() / "kernels" / f"cpu_kernels-{_digest(identity)}.so"
    if not target.is_file():
        try:
            _build(compiler, target)
        except (OSError, subprocess.CalledProcessError) as error:
            log.warning("could not build the CPU kernels (%s): using torch", error)
            return None
    library = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        lib = Path(tmp) / "kernels.so"
        # -ffast-math only when compiling: linking with it would set flush-to-zero for
        # the whole process (crtfastmath), changing torch's own numerics.
        for source, obj in zip(SOURCES, objects, strict=True):
            subprocess.run([compiler, *COMPILE_FLAGS, "-c", str(source), "-o", str(obj)],
                           check=True, capture_output=True)
        subprocess.run([compiler, "-shared", "-fopenmp", *map(str, objects), "-o", str(lib),
                        "-lm"], check=True, capture_output=True)
        os.replace(lib, target)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.paged_attention`."""
    attention = _kernel("paged_attention", query, k_cache, v_cache)
    if attention is None:
        return reference.paged_attention(
            query, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale)
    query = query.contiguous()
    out = torch.empty_like(query)
    plan = _plan(block_tables, context_lens, query_start_loc)
    if len(plan.rows):
        status = attention(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.rows.data_ptr(), plan.row_seqs.data_ptr(),
            len(plan.rows), plan.tables.shape[1], query.shape[1], k_cache.shape[2],
            query.shape[2], k_cache.shape[1], scale, torch.get_num_threads())
        if status != 0:
            raise MemoryError("paged attention: out of memory for the score buffer")
    long_chunks = plan.long_chunks
    if long_chunks and _prefill_vectorised():
        status = _kernel("paged_prefill", query)(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.long_seqs.data_ptr(), len(long_chunks),
            plan.tables.shape[1], query.shape[1], k_cache.shape[2], query.shape[2],
            k_cache.shape[1], scale, torch.get_num_threads())
        if status == 2:
            raise MemoryError("paged attention: out of memory for the transposed keys")
        if status == 0:
            long_chunks = []
    for seq, begin, end, context_len in long_chunks:
        out[begin:end] = _sdpa(query[begin:end], k_cache, v_cache, block_tables[seq],
                               context_len, scale)
    return out


@functools.cache
def _prefill_vectorised() -> bool:
    """Whether the chunked-prefill kernel was built (it needs AVX-512; else SDPA)."""
    library = kernel_library()
    return library is not None and bool(library.paged_prefill_vectorised())


class _Plan(NamedTuple):
    """How one step's batch splits between the row-by-row kernel (decodes, short chunks)
    and the chunked-prefill kernel or SDPA (long chunks), in the kernels' types."""

    rows: torch.Tensor  # int32: the query rows of short chunks (decodes, short prefills)
    row_seqs: torch.Tensor  # int32: the sequence of each of those rows
    tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    long_chunks: list[tuple[int, int, int, int]]  # (seq, first row, end row, context len)
    long_seqs: torch.Tensor  # int32: the sequences of the long chunks


def _per_step(make):
    """Memoise ``make`` on the identity of its tensor arguments, one entry deep. Every layer
    of a step is given the very same metadata tensors, never changed in place, so the first
    layer computes and the others reuse; weak references mean a freed tensor (a past step)
    never matches, even if a new one reuses its address."""
    last: list = [(), None]

    @functools.wraps(make)
    def memoised(*tensors: torch.Tensor):
        refs, value = last
        if len(refs) == len(tensors) and all(
                ref() is tensor for ref, tensor in zip(refs, tensors, strict=True)):
            return value
        value = make(*tensors)
        last[:] = [tuple(weakref.ref(tensor) for tensor in tensors), value]
        return value

    return memoised


@_per_step
def _slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The int64 slots to write and, when some rows are skipped (-1), the rows kept."""
    valid = slot_mapping >= 0
    if bool(valid.all()):
        return slot_mapping.long(), None
    return slot_mapping[valid].long(), valid


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Same contract as :func:`pagedchat.kernels.reference.store_kv`, with the slot check
    done once per step."""
    slots, kept = _slots(slot_mapping)
    if kept is not None:
        key, value = key[kept], value[kept]
    write_slots(key, value, k_cache, v_cache, slots)


@_per_step
def _plan(block_tables: torch.Tensor, context_lens: torch.Tensor,
          query_start_loc: torch.Tensor) -> _Plan:
    """How this step's batch splits between the row-by-row kernel and the long chunks."""
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    short = q_lens < (PREFILL_MIN_QUERY_LEN if _prefill_vectorised() else SDPA_MIN_QUERY_LEN)
    total = int(query_start_loc[-1])
    starts, lens = query_start_loc.tolist(), context_lens.tolist()
    long = (~short).nonzero().flatten().tolist()
    return _Plan(
        rows=torch.arange(total, dtype=torch.int32)[torch.repeat_interleave(short, q_lens)],
        row_seqs=torch.repeat_interleave(torch.arange(len(q_lens), dtype=torch.int32),
                                         q_lens * short),
        tables=block_tables.to(torch.int32).contiguous(),
        context_lens=context_lens.to(torch.int32).contiguous(),
        query_start_loc=query_start_loc.to(torch.int32).contiguous(),
        long_chunks=[(seq, starts[seq], starts[seq + 1], lens[seq]) for seq in long],
        long_seqs=torch.tensor(long, dtype=torch.int32),
    )


def _sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          block_table: torch.Tensor, context_len: int, scale: float) -> torch.Tensor:
    """A long chunk of one sequence: gather its context once, then torch's fused SDPA
    (causal, aligned to the end of the context). The inputs are 4-D on purpose: with 3-D
    ones torch 2.13 falls back to its slow path on the CPU (about 7x slower here)."""
    q_len = q.shape[0]
    k = gather_kv(k_cache, block_table, context_len).transpose(0, 1).unsqueeze(0)
    v = gather_kv(v_cache, block_table, context_len).transpose(0, 1).unsqueeze(0)
    q4 = q.transpose(0, 1).unsqueeze(0)
    if q_len == context_len:
        out = F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        q_pos = torch.arange(context_len - q_len, context_len).unsqueeze(1)
        allowed = torch.arange(context_len).unsqueeze(0) <= q_pos
        out = F.scaled_dot_product_attention(q4, k, v, attn_mask=allowed, scale=scale,
                                             enable_gqa=True)
    return out[0].transpose(0, 1)


def max_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`pagedchat.kernels.reference.max_logsumexp`, in one read of
    each row (torch reads the whole matrix three times and allocates a copy of it), float32
    or bfloat16 rows as they are."""
    function = _kernel("max_logsumexp", logits)
    if (function is None or logits.dim() != 2 or logits.stride(1) != 1
            or logits.shape[1] == 0):
        return reference.max_logsumexp(logits)
    rows, vocab = logits.shape
    top, lse = torch.empty(rows), torch.empty(rows)
    index = torch.empty(rows, dtype=torch.int64)
    function(logits.data_ptr(), rows, vocab, logits.stride(0), top.data_ptr(),
             index.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return top, index, lse


def _kernel(name: str, *tensors: torch.Tensor | None):
    """The C kernel ``name`` for these tensors' element type (float32 or bfloat16, the same
    for all, on the CPU; None stands for an absent optional tensor, never the first), else
    None (also where the kernel has no version for that type)."""
    dtype = tensors[0].dtype
    for tensor in tensors:
        if tensor is not None and (tensor.dtype != dtype or not tensor.is_cpu):
            return None
    return _typed_kernel(name, dtype)


@functools.cache
def _typed_kernel(name: str, dtype: torch.dtype):
    suffix = _SUFFIXES.get(dtype)
    function = f"{name}_{suffix}"
    library = kernel_library() if suffix is not None and function in _SIGNATURES else None
    return None if library is None else getattr(library, function)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`pagedchat.kernels.reference.rms_norm`: the residual add
    and the norm in one pass over each row."""
    function = _kernel("rms_norm", x, weight, residual)
    if function is None or x.dim() != 2 or not weight.is_contiguous():
        return reference.rms_norm(x, weight, eps, residual)
    x = x.contiguous()
    out = torch.empty_like(x)
    if residual is None:
        total, residual_ptr, total_ptr = x, None, None
    else:
        residual = residual.contiguous()
        total = torch.empty_like(x)
        residual_ptr, total_ptr = residual.data_ptr(), total.data_ptr()
    function(x.data_ptr(), residual_ptr, weight.data_ptr(), out.data_ptr(), total_ptr,
             x.shape[0], x.shape[1], eps, torch.get_num_threads())
    return out, total


def rotary_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.rotary_store`, one pass over
    each token: keys and values go straight to their slots."""
    function = _kernel("rotary_store", qkv, cos, sin, k_cache, v_cache)
    if (function is None or qkv.stride(1) != 1 or not k_cache.is_contiguous()
            or not v_cache.is_contiguous()):
        return reference.rotary_store(qkv, cos, sin, num_heads, k_cache, v_cache, slot_mapping)
    tokens, (kv_heads, head_dim) = qkv.shape[0], k_cache.shape[2:]
    cos, sin = cos.contiguous(), sin.contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype)
    function(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
             q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tokens, num_heads, kv_heads,
             head_dim, torch.get_num_threads())
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.silu_mul`, one pass."""
    function = _kernel("silu_mul", gate_up)
    if function is None or gate_up.dim() != 2:
        return reference.silu_mul(gate_up)
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype)
    function(gate_up.data_ptr(), out.data_ptr(), rows, width, torch.get_num_threads())
    return out


@functools.cache
def _linear_vectorised() -> bool:
    """Whether the C product was built with its AVX-512 path (its plain loops lose to BLAS)."""
    library = kernel_library()
    return library is not None and bool(library.linear_f32_vectorised())


@functools.cache
def _onednn() -> bool:
    """Whether torch has its oneDNN product (the one its compiler uses on the CPU) and it
    agrees with ``F.linear``."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w = torch.ones(2, 3), torch.ones(4, 3)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return torch.equal(_onednn_product(x, packed, None), F.linear(x, w))
    except (RuntimeError, AttributeError):
        return False


@functools.cache
def _onednn_bfloat16() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU: it needs AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and raises on others (AVX2-only CPUs), whose bfloat16 weights then stay
    plain and go through torch's product."""
    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if not supported:
        log.info("oneDNN has no bfloat16 product on this CPU: bfloat16 weights stay plain")
    return supported


def onednn_rows(rows: int) -> int:
    """The row count oneDNN is asked for: up to 16 rows as they are (a decode batch of a
    few sequences, bound by reading the weights: 16 rows cost 1.5x one), more rounded up to
    a multiple of a sixteenth of the next power of two, so at most 12% more.

    oneDNN builds, JIT-compiles and caches a product for each row count it sees; a step's
    row count changes from step to step: 126 row counts on three packed weights grew the
    process by 400 MB, rounded (48 counts up to 1,024 rows) by 107."""
    if rows <= 16:
        return rows
    grain = (1 << (rows - 1).bit_length()) // 16
    return -(-rows // grain) * grain


def _onednn_product(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 0:
        return x.new_empty(0, weight.shape[0])
    padded = onednn_rows(rows)
    x = F.pad(x, (0, 0, 0, padded - rows)) if padded != rows else x.contiguous()
    # the first rows of a contiguous product: still contiguous, no copy
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")[:rows]


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.pack_linear`: a float32 or
    bfloat16 weight reordered into oneDNN's blocked layout (the same bytes, another order).

    torch's ``F.linear`` takes MKL's sgemm in float32, which on some CPUs runs far below
    their vector units. Measured on AMD Zen 5 over this model's 120 layer products, the
    weights streamed from memory: float32, 64 rows 43 ms against 59 for the C product and
    61 for oneDNN on plain weights, 256 rows 137 against 152 and 152 (``F.linear``: about
    300); 1 to 16 rows within 5% of the C product, which reads plain weights only;
    bfloat16, 1 row 5.6 ms against 13.3 for ``F.linear``, 256 rows 72 against 88."""
    if (weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16)
            or weight.dim() != 2 or not _onednn()
            or (weight.dtype == torch.bfloat16 and not _onednn_bfloat16())):
        return weight
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
    _check_blocked(weight, packed)
    return packed


# (out, in, dtype) -> the padded input width where oneDNN packs weights of that shape and
# type in the blocked layout the C product reads (cpu_linear.c), else None
_BLOCKED_WIDTHS: dict[tuple[int, int, torch.dtype], int | None] = {}


def _check_blocked(weight: torch.Tensor, packed: torch.Tensor) -> None:
    """Note whether ``packed`` (oneDNN's packing of ``weight``) is in the blocked layout
    the C product reads. oneDNN picks its layout per shape, type and CPU, so it is checked
    once for each: the C product of a few random rows against F.linear on ``weight`` (a
    weight of zeros cannot tell layouts apart: the next one of its shape decides)."""
    key = (*weight.shape, weight.dtype)
    product = _kernel("linear_blocked", weight)
    if key in _BLOCKED_WIDTHS or product is None or not _linear_vectorised():
        return
    n_dim, k_dim = weight.shape
    k_padded, rest = divmod(torch.ops.mkldnn._nbytes(packed),
                            -(-n_dim // 64) * 64 * weight.element_size())
    if rest or k_padded < k_dim:
        _BLOCKED_WIDTHS[key] = None
        return
    x = torch.randn(3, k_dim, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
    out = torch.empty(3, n_dim, dtype=weight.dtype)
    product(x.data_ptr(), torch.ops.mkldnn.data_ptr(packed), None, out.data_ptr(), 3, k_dim,
            k_padded, n_dim, 1)
    expected = F.linear(x.float(), weight.float())
    if expected.norm() == 0:
        return
    tolerance = 1e-5 if weight.dtype == torch.float32 else 1e-2
    fits = (out.float() - expected).norm() <= tolerance * expected.norm()
    _BLOCKED_WIDTHS[key] = k_padded if fits else None


def blocked_width(packed: torch.Tensor) -> int | None:
    """The padded input width the C product reads ``packed`` with (a weight from
    :func:`pack_linear`), or None where oneDNN's own product must take it."""
    return _BLOCKED_WIDTHS.get((*packed.shape, packed.dtype))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.linear`. A packed weight goes to
    the C product for ``BLOCKED_ROWS`` rows where oneDNN's layout is the one it reads, else
    to oneDNN. A plain float32 one (a tied head whose layout the embedding cannot read)
    goes to the C product for ``LINEAR_ROWS`` rows, to oneDNN for more; anything else to
    torch. The C products write into ``out`` where given; the others are copied there."""
    if weight.is_mkldnn:
        rows, (n_dim, k_dim) = x.shape[0], weight.shape
        if (rows in BLOCKED_ROWS and x.dim() == 2 and x.dtype == weight.dtype
                and (bias is None or bias.dtype == weight.dtype)
                and (k_padded := blocked_width(weight)) is not None):
            x = x.contiguous()
            out = _output(out, rows, n_dim, x.dtype)
            _typed_kernel("linear_blocked", x.dtype)(
                x.data_ptr(), torch.ops.mkldnn.data_ptr(weight),
                None if bias is None else bias.contiguous().data_ptr(), out.data_ptr(), rows,
                k_dim, k_padded, n_dim, torch.get_num_threads())
            return out
        return _into(out, _onednn_product(x, weight, bias))
    product = _kernel("linear", x, weight, bias)  # there is no linear_bf16
    if product is None or x.dim() != 2 or not weight.is_contiguous():
        return reference.linear(x, weight, bias, out)
    if x.shape[0] in LINEAR_ROWS and _linear_vectorised():
        x = x.contiguous()
        out = _output(out, x.shape[0], weight.shape[0], x.dtype)
        product(x.data_ptr(), weight.data_ptr(),
                None if bias is None else bias.data_ptr(), out.data_ptr(),
                x.shape[0], x.shape[1], weight.shape[0], torch.get_num_threads())
        return out
    if x.shape[0] == 0 or not _onednn():
        return reference.linear(x, weight, bias, out)
    return _into(out, _onednn_product(x, weight, bias))


def _output(out: torch.Tensor | None, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """``out`` checked for a product's ``[rows, width]`` result, or a new tensor."""
    if out is None:
        return torch.empty(rows, width, dtype=dtype)
    if out.shape != (rows, width) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"linear: out is {tuple(out.shape)} {out.dtype}, the product is "
                         f"({rows}, {width}) {dtype}, contiguous")
    return out


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    return result if out is None else _output(out, *result.shape, result.dtype).copy_(result)


def pack_embedding(weight: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.pack_embedding`: packed as
    :func:`pack_linear` packs it where the C product reads oneDNN's layout (and so
    :func:`embedding` can find each row in it), else as it is. The head then takes the
    C product (float32 on AMD Zen 5 against the plain weight's path: 1 row 1.27x, 64
    rows 1.24x, 256 rows 1.02x; bfloat16: 2.36x, 1.28x, 0.97x), which writes the logits
    into the runner's buffer."""
    packed = pack_linear(weight)
    if not packed.is_mkldnn or blocked_width(packed) is None:
        return weight
    return packed


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.embedding`; rows of a weight
    :func:`pack_embedding` packed are gathered from oneDNN's blocked layout."""
    if not weight.is_mkldnn:
        return reference.embedding(ids, weight)
    ids = ids.to(torch.int64).contiguous()
    if ids.numel() and not (0 <= (bounds := ids.aminmax()).min
                            and bounds.max < weight.shape[0]):
        raise IndexError(f"embedding: ids outside [0, {weight.shape[0]})")
    out = torch.empty(*ids.shape, weight.shape[1], dtype=weight.dtype)
    _typed_kernel("embedding_blocked", weight.dtype)(
        ids.data_ptr(), torch.ops.mkldnn.data_ptr(weight), out.data_ptr(), ids.numel(),
        weight.shape[1], blocked_width(weight), torch.get_num_threads())
    return out


class LayerTensors(NamedTuple):
    """One decoder layer's weights (as the model holds them: products packed) and caches."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


class _DecoderLayer(ctypes.Structure):
    """``DecoderLayer`` in ``cpu_decoder.c``."""

    _fields_ = [(name, _P) for name in ("input_norm", "post_norm", "qkv", "qkv_bias", "o",
                                        "gate_up", "down")] + \
               [(name, _INT) for name in ("qkv_padded", "o_padded", "gate_up_padded",
                                          "down_padded")] + \
               [("k_cache", _P), ("v_cache", _P)]


class _DecoderStep(ctypes.Structure):
    """``DecoderStep`` in ``cpu_decoder.c``."""

    _fields_ = [(name, _INT) for name in ("rows", "hidden", "heads", "kv_heads", "head_dim",
                                          "intermediate", "block_size", "max_blocks",
                                          "attention_rows", "num_threads")] + \
               [("eps", _FLOAT), ("scale", _FLOAT)] + \
               [(name, _P) for name in ("cos", "sin", "slots", "block_tables", "context_lens",
                                        "query_start", "row_ids", "row_seqs", "h", "qkv", "q",
                                        "attention", "gate_up", "act")]


class DecoderStack:
    """Every decoder layer of a model in one C call, for steps of up to
    ``BLOCKED_ROWS`` query rows that are all decodes or short chunks: the same kernels as
    the per-layer calls, in the same order (so the same result, bit for bit), without
    their Python dispatch. Built by :func:`decoder_stack`, which checks the weights."""

    def __init__(self, layers: list[LayerTensors], num_heads: int, eps: float,
                 scale: float) -> None:
        first = layers[0]
        self.hidden = first.input_norm.shape[0]
        self.heads = num_heads
        _, self.block_size, self.kv_heads, self.head_dim = first.k_cache.shape
        self.qkv_width = first.qkv.shape[0]
        self.intermediate = first.gate_up.shape[0] // 2
        self.eps, self.scale = eps, scale
        self.dtype = first.input_norm.dtype
        self._decoder = _kernel("decoder_layers", first.input_norm)
        self._tensors = layers  # keeps what the pointers point at alive
        self._layers = (_DecoderLayer * len(layers))(*(
            _DecoderLayer(
                layer.input_norm.data_ptr(), layer.post_norm.data_ptr(),
                torch.ops.mkldnn.data_ptr(layer.qkv),
                None if layer.qkv_bias is None else layer.qkv_bias.data_ptr(),
                *(torch.ops.mkldnn.data_ptr(weight)
                  for weight in (layer.o, layer.gate_up, layer.down)),
                *(blocked_width(weight)
                  for weight in (layer.qkv, layer.o, layer.gate_up, layer.down)),
                layer.k_cache.data_ptr(), layer.v_cache.data_ptr())
            for layer in layers))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor,
                 query_start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last layer's output and the residual stream still to be added to it (as the
        layers return them), or None where this step is not one for the stack."""
        rows = x.shape[0]
        if rows not in BLOCKED_ROWS or x.dtype != self.dtype or cos.dtype != self.dtype:
            return None
        plan = _plan(block_tables, context_lens, query_start_loc)
        if plan.long_chunks:
            return None
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        slots = slot_mapping.to(torch.int64).contiguous()
        residual = torch.empty_like(x)
        q_size = self.heads * self.head_dim
        scratch = [torch.empty(rows, width, dtype=self.dtype) for width in (
            self.hidden, self.qkv_width, q_size, q_size, 2 * self.intermediate,
            self.intermediate)]
        step = _DecoderStep(
            rows, self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate,
            self.block_size, plan.tables.shape[1], len(plan.rows), torch.get_num_threads(),
            self.eps, self.scale, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.rows.data_ptr(), plan.row_seqs.data_ptr(),
            *(buffer.data_ptr() for buffer in scratch))
        status = self._decoder(
            self._layers, len(self._tensors), ctypes.byref(step), x.data_ptr(),
            residual.data_ptr())
        if status != 0:
            raise MemoryError("paged attention: out of memory for the score buffer")
        return x, residual


def decoder_stack(layers: list[LayerTensors], num_heads: int, eps: float,
                  scale: float) -> DecoderStack | None:
    """The layers as one C call where they can be: float32 or bfloat16 on the CPU, every
    product's weight packed in the blocked layout the C product reads, caches contiguous;
    else None (the model then calls its layers one by one)."""
    if not layers or _kernel("decoder_layers", layers[0].input_norm) is None:
        return None
    dtype = layers[0].input_norm.dtype
    for layer in layers:
        products = (layer.qkv, layer.o, layer.gate_up, layer.down)
        plain = [layer.input_norm, layer.post_norm, layer.k_cache, layer.v_cache]
        if layer.qkv_bias is not None:
            plain.append(layer.qkv_bias)
        if not all(weight.is_mkldnn and weight.dtype == dtype
                   and blocked_width(weight) is not None for weight in products):
            return None
        if not all(tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous()
                   for tensor in plain):
            return None
    return DecoderStack(layers, num_heads, eps, scale)


# last: cpu_quant builds on this module's kernel_library
from pagedchat.kernels.cpu_quant import quantized_embedding, quantized_linear  # noqa: E402
