"""Tensors against an unreadable page, for the kernel tests: a kernel that reads one byte
past the end (or before the start) of such an operand ends the process with a
segmentation fault, on real CPUs, where a read outside a torch allocation usually lands in
readable memory and goes unseen. Masked-off lanes of a masked load do not count: the CPU
never touches them. An emulator that reads more than an instruction's operand faults here
where a CPU does not (qemu's user mode, 7.2 and 10.0 alike, reads a whole vector for a
scalar FMA's memory operand): these tests are for real CPUs."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import torch

EDGES = ("end", "start")
_PROT_NONE = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def at_page_edge(t: torch.Tensor, edge: str) -> torch.Tensor:
    """A contiguous copy of ``t`` that ends right before an unreadable page (``edge`` "end")
    or starts right after one ("start"), in memory of its own, freed with the tensor."""
    data = t.detach().contiguous().reshape(-1).view(torch.uint8)
    size = data.numel()
    pages = -(-size // mmap.PAGESIZE) + 2  # a guard page before and after
    region = mmap.mmap(-1, pages * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    for guard in (base, base + (pages - 1) * mmap.PAGESIZE):
        if _libc.mprotect(guard, mmap.PAGESIZE, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    offset = (pages - 1) * mmap.PAGESIZE - size if edge == "end" else mmap.PAGESIZE
    copy = torch.from_numpy(np.frombuffer(region, dtype=np.uint8, count=size, offset=offset))
    copy.copy_(data)
    return copy.view(t.dtype).reshape(t.shape)
