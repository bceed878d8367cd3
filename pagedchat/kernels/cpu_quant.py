"""The CPU's products and embedding lookups on quantized weights (``cpu_quant.c``, built
with the backend's other C kernels), with the contracts of :func:`quant.quantized_linear`
and :func:`quant.quantized_embedding`; the torch reference where the kernels are not built.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pagedchat.kernels import quant
from pagedchat.kernels.quant import QuantizedWeight

__all__ = ["quantized_embedding", "quantized_linear"]

_P, _INT, _INT64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
_SIGNATURES = {
    "quant_linear_f32": (_INT, [_P, _P, _INT, _P, _P] + [_INT] * 3 + [_INT64, _INT]),
    "quant_linear_bf16": (_INT, [_P, _P, _INT, _P, _P] + [_INT] * 3 + [_INT64, _INT]),
    "quant_embedding": (_INT, [_P, _P, _INT, _P] + [_INT] * 4),
}
_TYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


@functools.cache
def _library() -> ctypes.CDLL | None:
    from pagedchat.kernels.cpu import kernel_library  # cpu imports this module

    library = kernel_library()
    return None if library is None else bind(library)


def bind(library: ctypes.CDLL) -> ctypes.CDLL:
    """``library`` with the quantized kernels' signatures declared (a build of
    ``cpu_quant.c`` alone, for one instruction set, works too)."""
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def _check(status: int, what: str) -> None:
    if status == 2:
        raise MemoryError(f"{what}: out of memory for the decoded weights")
    if status != 0:
        raise ValueError(f"{what}: a quantization the kernel does not know")


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight,
                     bias: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.quant.quantized_linear`: each segment of
    the weight writes its columns of ``out``."""
    library = _library()
    if (library is None or x.dtype not in _TYPES or x.dim() != 2 or not x.is_cpu
            or x.shape[1] != weight.in_features):
        return quant.quantized_linear(x, weight, bias, out)
    rows, n_dim = x.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty(rows, n_dim, dtype=x.dtype)
    elif out.shape != (rows, n_dim) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"linear: out is {tuple(out.shape)} {out.dtype}, the product is "
                         f"({rows}, {n_dim}) {x.dtype}, contiguous")
    if rows == 0:
        return out
    x = x.contiguous()
    bias = None if bias is None else bias.float().contiguous()
    product = getattr(library, f"quant_linear_{_TYPES[x.dtype]}")
    first, threads = 0, torch.get_num_threads()
    for segment in weight.segments:
        status = product(
            x.data_ptr(), segment.data.data_ptr(), segment.format.type_id,
            None if bias is None else bias[first:].data_ptr(), out[:, first:].data_ptr(),
            rows, weight.in_features, segment.rows, n_dim, threads)
        _check(status, "linear")
        first += segment.rows
    return out


def quantized_embedding(ids: torch.Tensor, weight: QuantizedWeight,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.quant.quantized_embedding`, for a weight
    of one segment (an embedding table)."""
    library = _library()
    if library is None or dtype not in _TYPES or len(weight.segments) != 1:
        return quant.quantized_embedding(ids, weight, dtype)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and not (0 <= (bounds := flat.aminmax()).min
                             and bounds.max < weight.shape[0]):
        raise IndexError(f"embedding: ids outside [0, {weight.shape[0]})")
    out = torch.empty(flat.numel(), weight.in_features, dtype=dtype)
    segment = weight.segments[0]
    _check(library.quant_embedding(
        flat.data_ptr(), segment.data.data_ptr(), segment.format.type_id, out.data_ptr(),
        int(dtype == torch.bfloat16), flat.numel(), weight.in_features,
        torch.get_num_threads()), "embedding")
    return out.reshape(*ids.shape, weight.in_features)
