"""The Triton (GPU) backend of pagedchat's kernels, same API as ``reference``.

Importing it requires Triton. On a machine without a GPU it only works under
``TRITON_INTERPRET=1`` (set before this module is first imported), which is how the tests
run it on CPU. ``swap_blocks`` is a plain device <-> host copy and ``max_logsumexp`` two
reductions over the logits: torch does both well.
"""

from __future__ import annotations

from pagedchat.kernels.reference import max_logsumexp, swap_blocks
from pagedchat.kernels.triton_attention import (
    choose_num_splits,
    paged_attention,
    paged_attention_decode,
    paged_attention_prefill,
)
from pagedchat.kernels.triton_cache import copy_blocks, store_kv
from pagedchat.kernels.triton_utils import INTERPRETED

__all__ = [
    "INTERPRETED",
    "choose_num_splits",
    "copy_blocks",
    "max_logsumexp",
    "paged_attention",
    "paged_attention_decode",
    "paged_attention_prefill",
    "store_kv",
    "swap_blocks",
]
