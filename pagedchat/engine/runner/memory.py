"""The process's memory around the model: glibc's handling of freed buffers, KV pools and
logits in mappings of their own, and results copied to the host."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def hand_back_freed_memory() -> None:
    """While a model loads: what was freed so far goes back to the system, and so does each large
    buffer loading frees from now on (glibc's adaptive mmap threshold would keep them in the heap,
    and the peak would hold the weights about twice). Process-wide; a no-op without glibc."""
    _trim_and_set(64 << 10, 1 << 20)


def keep_freed_memory() -> None:
    """Hand back what loading freed, then have glibc keep freed activation buffers for reuse
    (by default it maps large ones afresh, and each step's activations page-fault in again).
    Process-wide; a no-op without glibc."""
    _trim_and_set(128 << 20, 1 << 30)


def _trim_and_set(mmap_threshold: int, trim_threshold: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except (OSError, AttributeError):
        pass


def anonymous_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in a memory mapping of its own (huge pages where the
    kernel gives them, for attention's scattered block reads), which goes back to the system
    with its last view, where malloc would keep it (see keep_freed_memory)."""
    size = int(np.prod(shape)) * dtype.itemsize
    if size == 0:
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    # the tensor holds the mapping open; unmapped when it and its views are gone
    return torch.frombuffer(mapping, dtype=dtype).view(shape)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU; from a GPU, into page-locked memory (torch reuses freed
    blocks of it), far sooner than ``Tensor.cpu()`` for a large block of logits."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor)
