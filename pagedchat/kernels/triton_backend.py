"""The Triton (GPU) backend of pagedchat's kernels: it keeps ``KernelBackend`` (backend.py).

Importing it requires Triton. On a machine without a GPU it only works under
``TRITON_INTERPRET=1`` (set before this module is first imported), which is how the tests
run it on CPU. ``swap_blocks`` is a plain device <-> host copy, ``max_logsumexp`` two
reductions over the logits, ``linear`` and ``embedding`` torch's own (``pack_linear`` and
``pack_embedding`` leave weights as they are), and ``rms_norm``, ``silu_mul``,
``gelu_tanh_mul`` and the rotation in ``rotary_store`` elementwise work that torch launches
as a few kernels each: those come from the reference. So do the products on quantized
weights, which the engine keeps on the CPU only: here they serve the Triton kernels
interpreted on the CPU.
"""

from __future__ import annotations

import torch

from pagedchat.kernels.reference import (
    embedding,
    gelu_tanh_mul,
    linear,
    max_logsumexp,
    pack_embedding,
    pack_linear,
    quantized_embedding,
    quantized_linear,
    rms_norm,
    screen_candidates,
    silu_mul,
    split_rotary,
    swap_blocks,
)
from pagedchat.kernels.triton_attention import (
    choose_num_splits,
    paged_attention,
    paged_attention_decode,
    paged_attention_prefill,
)
from pagedchat.kernels.triton_cache import copy_blocks, store_kv
from pagedchat.kernels.triton_utils import INTERPRETED

__all__ = ["INTERPRETED", "choose_num_splits", "copy_blocks", "embedding", "gelu_tanh_mul",
           "linear", "max_logsumexp", "pack_embedding", "pack_linear", "paged_attention",
           "paged_attention_decode", "paged_attention_prefill", "quantized_embedding",
           "quantized_linear", "rms_norm", "rotary_store", "screen_candidates", "silu_mul",
           "store_kv", "swap_blocks"]


def rotary_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
    """The reference's rotation, then this backend's store."""
    q, k, v = split_rotary(qkv, cos, sin, num_heads, k_cache.shape[2])
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
