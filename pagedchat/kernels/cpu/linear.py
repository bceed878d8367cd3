"""Linear layers on the CPU: weights packed once into oneDNN's layout, a compiled product
(linear.c) that reads that layout for a few rows, oneDNN's own product for more,
a compiled product of a few rows on plain float32 weights (a tied head whose packing the C
product cannot read), and the embedding read from a packed tied head."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from pagedchat.kernels import reference
from pagedchat.kernels.cpu.build import INT, P, declare, kernel, on_isa_change, typed_kernel

log = logging.getLogger("pagedchat.kernels.cpu")

# Up to 16 rows (a decode step of a few sequences, bound by reading the weights) the C
# product, which reads each weight once, takes a plain weight (a tied head whose packing it
# cannot read) and a packed one in oneDNN's blocked layout; more rows go to oneDNN's own
# product, which keeps far more of its vector units busy.
LINEAR_ROWS = range(1, 17)
BLOCKED_ROWS = range(1, 17)

declare({
    "linear_blocked": (None, [P] * 4 + [INT] * 5),
    "embedding_blocked": (None, [P] * 3 + [INT] * 4),
}, {"linear_f32": (None, [P] * 4 + [INT] * 4)})


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
    """The row count oneDNN is asked for: up to 16 rows as they are, more rounded up to a multiple
    of a sixteenth of the next power of two (at most an eighth more), so that the product oneDNN
    compiles and caches per row count comes in a few dozen counts, not one per step's count."""
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
    bfloat16 weight reordered into oneDNN's blocked layout (the same bytes, another order),
    whose product beats ``F.linear``'s MKL sgemm and matches the C one on plain weights."""
    if (weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16)
            or weight.dim() != 2 or not _onednn()
            or (weight.dtype == torch.bfloat16 and not _onednn_bfloat16())):
        return weight
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
    _check_blocked(weight, packed)
    return packed


# (out, in, dtype) -> the padded input width where oneDNN packs weights of that shape and
# type in the blocked layout the C product reads (linear.c), else None
_BLOCKED_WIDTHS: dict[tuple[int, int, torch.dtype], int | None] = {}
# each level checks the layouts with its own product
on_isa_change(_BLOCKED_WIDTHS.clear)


def _check_blocked(weight: torch.Tensor, packed: torch.Tensor) -> None:
    """Note whether ``packed`` (oneDNN's packing of ``weight``) is in the blocked layout
    the C product reads. oneDNN picks its layout per shape, type and CPU, so it is checked
    once for each: the C product of a few random rows against F.linear on ``weight`` (a
    weight of zeros cannot tell layouts apart: the next one of its shape decides)."""
    key = (*weight.shape, weight.dtype)
    product = kernel("linear_blocked", weight)
    if key in _BLOCKED_WIDTHS or product is None:
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
            typed_kernel("linear_blocked", x.dtype)(
                x.data_ptr(), torch.ops.mkldnn.data_ptr(weight),
                None if bias is None else bias.contiguous().data_ptr(), out.data_ptr(), rows,
                k_dim, k_padded, n_dim, torch.get_num_threads())
            return out
        return _into(out, _onednn_product(x, weight, bias))
    product = kernel("linear", x, weight, bias)  # there is no linear_bf16
    if product is None or x.dim() != 2 or not weight.is_contiguous():
        return reference.linear(x, weight, bias, out)
    if x.shape[0] in LINEAR_ROWS:
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
    C product, faster than the plain weight's path for a decode step's rows, which writes
    the logits into the runner's buffer."""
    packed = pack_linear(weight)
    return packed if packed.is_mkldnn and blocked_width(packed) is not None else weight


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.embedding`; rows of a weight
    :func:`pack_embedding` packed are gathered from oneDNN's blocked layout."""
    if not weight.is_mkldnn:
        return reference.embedding(ids, weight)
    if (k_padded := blocked_width(weight)) is None:  # packed before set_isa switched levels
        return reference.embedding(ids, weight.to_dense())
    ids = ids.to(torch.int64).contiguous()
    if ids.numel() and not (0 <= (bounds := ids.aminmax()).min and bounds.max < weight.shape[0]):
        raise IndexError(f"embedding: ids outside [0, {weight.shape[0]})")
    out = torch.empty(*ids.shape, weight.shape[1], dtype=weight.dtype)
    typed_kernel("embedding_blocked", weight.dtype)(
        ids.data_ptr(), torch.ops.mkldnn.data_ptr(weight), out.data_ptr(), ids.numel(),
        weight.shape[1], k_padded, torch.get_num_threads())
    return out
