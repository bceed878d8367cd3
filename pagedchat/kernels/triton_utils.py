"""What the Triton kernel modules share: whether Triton interprets, and a device check."""

from __future__ import annotations

import os

import torch
import triton


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Triton picks interpreter or compiler when it is imported (TRITON_INTERPRET=1 or not).
INTERPRETED = _interpreting()


def check_device(tensor: torch.Tensor, what: str) -> None:
    """A clear error instead of Triton's when a CPU tensor meets the compiler."""
    if tensor.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            f"{what}: Triton kernels need a GPU, or TRITON_INTERPRET=1 set before triton is "
            "imported to run on CPU; use the torch reference kernels instead"
        )
