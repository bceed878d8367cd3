"""The sampler's per-row reduction over the logits, and a greedy head's screen of
approximate logits, on the CPU (sampling.c)."""

from __future__ import annotations

import torch

from pagedchat.kernels import reference
from pagedchat.kernels.cpu.build import INT, INT64, P, declare, kernel, kernel_library

declare({"max_logsumexp": (None, [P, INT, INT, INT64, P, P, P, INT])},
        {"screen_rows": (None, [P, INT, INT, INT64, P, P, P, INT, P, P, INT])})


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


def screen_candidates(approx: torch.Tensor, norms: torch.Tensor, slack: torch.Tensor,
                      capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`pagedchat.kernels.reference.screen_candidates`, in one
    read of each row, then a scan of the few runs of 256 that can hold a candidate."""
    library = kernel_library()
    if (library is None or approx.dtype != torch.float32 or approx.dim() != 2
            or approx.stride(1) != 1 or not approx.is_cpu):
        return reference.screen_candidates(approx, norms, slack, capacity)
    rows, vocab = approx.shape
    norms = norms.float().contiguous()
    slack = slack.float().contiguous()
    found = torch.full((rows, capacity), -1, dtype=torch.int32)
    counts = torch.empty(rows, dtype=torch.int32)
    threads = torch.get_num_threads()
    scratch = torch.empty(threads, vocab // 256 + 1)  # sampling.c's chunk maxima
    library.screen_rows(approx.data_ptr(), rows, vocab, approx.stride(0), norms.data_ptr(),
                        slack.data_ptr(), found.data_ptr(), capacity, counts.data_ptr(),
                        scratch.data_ptr(), threads)
    return found, counts
