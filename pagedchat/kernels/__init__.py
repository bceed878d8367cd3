"""PagedAttention kernels behind one interface.

Every backend exposes ``store_kv``, ``paged_attention``, ``copy_blocks``, ``swap_blocks``,
``max_logsumexp`` (the sampler's per-row reduction), ``linear`` (with ``pack_linear``, which
lays a weight out for it once at load), ``embedding`` (with ``pack_embedding``, for a weight
the head shares) and the layer's small
operations ``rms_norm``, ``rotary_store`` (rotation of queries and keys, then the store)
and ``silu_mul``, with the signatures of :mod:`pagedchat.kernels.reference`, which
defines what is right. A backend may also offer ``decoder_stack`` (with ``LayerTensors``):
a whole decoder stack in one call where a step is small, built from the same kernels, so
that the model's result does not change (the CPU backend has one).

- ``triton``: Triton kernels, picked on CUDA;
- ``cpu``: compiled C kernels (attention for decode and short chunks, a tiled kernel or
  SDPA for long ones; the layer's small operations; products of a few rows; the decoder
  stack of a small decode batch), picked on the CPU (it falls back to the reference when
  no C compiler is found);
- ``torch``: the reference itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

BACKENDS = ("torch", "cpu", "triton")
_MODULES = {"torch": "reference", "cpu": "cpu", "triton": "triton_backend"}


def select_backend(device: str, preference: str = "auto") -> ModuleType:
    """The kernel module for ``device`` (``"cpu"``, ``"cuda"``...) and a preference."""
    if preference not in ("auto", *BACKENDS):
        raise ValueError(
            f"unknown attention backend {preference!r} (choose auto, {', '.join(BACKENDS)})")
    name = preference
    if preference == "auto":
        on_cuda = device.startswith("cuda")
        name = "triton" if on_cuda and importlib.util.find_spec("triton") else (
            "torch" if on_cuda else "cpu")
    if name == "triton" and not device.startswith("cuda"):
        # Triton decides interpreter or compiler when first imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return importlib.import_module(f"pagedchat.kernels.{_MODULES[name]}")
