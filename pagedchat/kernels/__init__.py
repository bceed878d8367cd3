"""PagedAttention kernels behind one interface (:mod:`.backend`): the K/V store and block
copies, paged attention, the sampler's reduction, linear layers and the embedding (on packed
layouts or a GGUF's quantized blocks) and the layer's small operations. The CPU backend's
``decoder_stack`` runs a whole small step's layers in one call, from the same kernels.

- ``triton``: Triton kernels, picked on CUDA;
- ``cpu``: compiled C kernels (:mod:`.cpu`), picked on the CPU (the reference without a C
  compiler);
- ``torch``: the reference itself."""

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
