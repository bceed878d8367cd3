"""The process's memory around the model: glibc's handling of freed buffers, KV pools and
logits in mappings of their own, and results copied to the host."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def hand_back_freed_memory() -> None:
    """While a model loads: a fixed mmap threshold, so each large buffer that loading frees
    (a tensor read, a fused copy's parts, the tokenizer's scratch) goes back to the system
    at once. glibc's adaptive threshold would keep them in the heap, and the peak would
    hold the weights about twice. What was freed before (the small pieces of a tokenizer's
    parse, spread over the heap) goes back now. Process-wide; a no-op without glibc."""
    _trim_and_set(64 << 10, 1 << 20)


def keep_freed_memory() -> None:
    """Hand back what loading the weights freed, then have glibc keep freed activation
    buffers for reuse instead of returning them to the OS. By default it maps every buffer
    over its (adaptive) threshold afresh and trims its heap, so each step's large
    activations page-fault in again, a large share of a long prefill's time. Process-wide;
    a no-op without glibc."""
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
    """An uninitialised CPU tensor in a memory mapping of its own, in huge pages where the
    kernel gives them. Unlike torch's allocation, which malloc keeps for reuse once freed
    (see keep_freed_memory), the mapping goes back to the system when the last view of it
    goes: otherwise a bench that builds one engine per request rate grows by a KV pool per
    engine. Huge pages spare the scattered block reads of attention their TLB misses."""
    size = int(np.prod(shape)) * dtype.itemsize
    if size == 0:
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    # the tensor holds the mapping open; unmapped when it and its views are gone
    return torch.frombuffer(mapping, dtype=dtype).view(shape)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU. From a GPU, into page-locked memory (torch keeps freed
    page-locked blocks for reuse): a large block of logits comes back far sooner this way
    than through ``Tensor.cpu()``."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor)
