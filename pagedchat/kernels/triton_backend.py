"""The Triton (GPU) backend of pagedchat's kernels: it keeps ``KernelBackend`` (backend.py).

Importing it requires Triton; without a GPU it works only under ``TRITON_INTERPRET=1`` (set
before its first import), as the tests run it. Attention and the K/V store and copies are
Triton kernels; the rest is the reference's (torch runs each as a few kernels already), whose
products on quantized weights serve the Triton kernels interpreted on the CPU."""

from __future__ import annotations

import torch

from pagedchat.kernels import reference
from pagedchat.kernels.triton_attention import (
    choose_num_splits,
    paged_attention,
    paged_attention_decode,
    paged_attention_prefill,
)
from pagedchat.kernels.triton_cache import copy_blocks, store_kv
from pagedchat.kernels.triton_utils import INTERPRETED

__all__ = ["INTERPRETED", "choose_num_splits", "copy_blocks", "paged_attention",
           "paged_attention_decode", "paged_attention_prefill", "rotary_store", "store_kv"]


def __getattr__(name: str) -> object:
    """The reference's operation ``name``, where this backend has none of its own."""
    return getattr(reference, name)


def rotary_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
    """The reference's rotation, then this backend's store."""
    q, k, v = reference.split_rotary(qkv, cos, sin, num_heads, k_cache.shape[2])
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
