"""The CPU's products and embedding lookups on quantized weights (``quant.c``), with the
contracts of :func:`pagedchat.kernels.quant.quantized_linear` and ``quantized_embedding``;
the torch reference where the kernels are not built."""

from __future__ import annotations

import ctypes
import weakref

import torch

from pagedchat.kernels import quant
from pagedchat.kernels.cpu.build import INT, INT64, P, declare, kernel_library, load_products
from pagedchat.kernels.quant import QuantizedWeight

declare({"quant_linear": (INT, [P, P, INT, P, P] + [INT] * 3 + [INT64, INT, P])},
        {"quant_embedding": (INT, [P, P, INT, P] + [INT] * 4), "set_products": (INT, [INT, P, P])})
_TYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_PRODUCTS = {dtype: f"quant_linear_{suffix}" for dtype, suffix in _TYPES.items()}
# weight -> how its products split the columns among the threads (threads + 1 fractions),
# which quant.c moves toward the threads' speeds after each product (rebalance in kernels.h)
_BOUNDS: weakref.WeakKeyDictionary[QuantizedWeight, ctypes.Array] = weakref.WeakKeyDictionary()


def thread_split(split: ctypes.Array | None, threads: int) -> ctypes.Array:
    """``split`` (the C kernels' ``bounds``: threads + 1 float fractions, see thread_run in
    ggml_formats.h) where it is one for ``threads`` threads, else the equal split."""
    if split is not None and len(split) == threads + 1:
        return split
    return (ctypes.c_float * (threads + 1))(*(i / threads for i in range(threads + 1)))


def _check(status: int, what: str) -> None:
    if status == 2:
        raise MemoryError(f"{what}: out of memory for the decoded weights")
    if status != 0:
        raise ValueError(f"{what}: a quantization the kernel does not know")


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight,
                     bias: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.quant.quantized_linear`: each segment of
    the weight writes its columns of ``out``. Called once per layer and step, so it keeps
    to plain ints and pointers between the checks and the C calls."""
    library = kernel_library()
    if (library is None or x.dtype not in _PRODUCTS or x.dim() != 2 or not x.is_cpu
            or x.shape[1] != weight.in_features):
        return quant.quantized_linear(x, weight, bias, out)
    rows, n_dim = x.shape[0], weight.out_features
    if out is None:
        out = torch.empty(rows, n_dim, dtype=x.dtype)
    elif out.shape != (rows, n_dim) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"linear: out is {tuple(out.shape)} {out.dtype}, the product is "
                         f"({rows}, {n_dim}) {x.dtype}, contiguous")
    if rows == 0:
        return out
    x = x.contiguous()
    product = getattr(library, _PRODUCTS[x.dtype])
    threads, width = torch.get_num_threads(), weight.in_features
    x_at, out_at, size = x.data_ptr(), out.data_ptr(), out.element_size()
    bias_at = None
    if bias is not None:
        bias = bias.float().contiguous()
        bias_at = bias.data_ptr()
    first = 0
    split = _BOUNDS[weight] = thread_split(_BOUNDS.get(weight), threads)
    bounds = ctypes.addressof(split)
    for segment in weight.segments:
        arguments = (x_at, segment.data.data_ptr(), segment.kernel_type(weight.int8_activations),
                     None if bias_at is None else bias_at + 4 * first, out_at + size * first,
                     rows, width, segment.rows, n_dim, threads, bounds)
        status = product(*arguments)
        if status == 1 and load_products([arguments[2]], library):  # the format's first product
            status = product(*arguments)
        _check(status, "linear")
        first += segment.rows
    return out


def quantized_embedding(ids: torch.Tensor, weight: QuantizedWeight,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.quant.quantized_embedding`, for a weight
    of one segment (an embedding table)."""
    library = kernel_library()
    if library is None or dtype not in _TYPES or len(weight.segments) != 1:
        return quant.quantized_embedding(ids, weight, dtype)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and not (0 <= (bounds := flat.aminmax()).min and bounds.max < weight.shape[0]):
        raise IndexError(f"embedding: ids outside [0, {weight.shape[0]})")
    out = torch.empty(flat.numel(), weight.in_features, dtype=dtype)
    segment = weight.segments[0]
    _check(library.quant_embedding(
        flat.data_ptr(), segment.data.data_ptr(), segment.format.type_id, out.data_ptr(),
        int(dtype == torch.bfloat16), flat.numel(), weight.in_features,
        torch.get_num_threads()), "embedding")
    return out.reshape(*ids.shape, weight.in_features)
