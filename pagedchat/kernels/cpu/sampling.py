"""The sampler's per-row reduction over the logits on the CPU (sampling.c)."""

from __future__ import annotations

import torch

from pagedchat.kernels import reference
from pagedchat.kernels.cpu.build import INT, INT64, P, declare, kernel

declare({"max_logsumexp": (None, [P, INT, INT, INT64, P, P, P, INT])})


def max_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`pagedchat.kernels.reference.max_logsumexp`, in one read of
    each row (torch reads the whole matrix three times and allocates a copy of it), float32
    or bfloat16 rows as they are."""
    function = kernel("max_logsumexp", logits)
    if (function is None or logits.dim() != 2 or logits.stride(1) != 1
            or not 0 < logits.shape[1] < 1 << 24):
        return reference.max_logsumexp(logits)
    rows, vocab = logits.shape
    top, lse = torch.empty(rows), torch.empty(rows)
    index = torch.empty(rows, dtype=torch.int64)
    function(logits.data_ptr(), rows, vocab, logits.stride(0), top.data_ptr(),
             index.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return top, index, lse
