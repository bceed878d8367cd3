"""PagedAttention kernels behind one interface.

Every backend exposes ``store_kv``, ``paged_attention``, ``copy_blocks`` and
``swap_blocks`` with the signatures of :mod:`pagedchat.kernels.reference`, which
defines what is right. Triton serves CUDA tensors; the torch reference serves the CPU.
"""

from __future__ import annotations

import importlib
from types import ModuleType

BACKENDS = ("torch", "triton")


def select_backend(device: str, preference: str = "auto") -> ModuleType:
    """The kernel module for ``device``: ``auto`` picks Triton on CUDA, torch elsewhere."""
    if preference not in ("auto", *BACKENDS):
        raise ValueError(f"unknown attention backend {preference!r} (choose auto, torch or triton)")
    name = preference
    if preference == "auto":
        name = "triton" if device.startswith("cuda") and _triton_available() else "torch"
    if name == "triton":
        return importlib.import_module("pagedchat.kernels.triton_backend")
    return importlib.import_module("pagedchat.kernels.reference")


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None
