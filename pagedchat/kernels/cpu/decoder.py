"""A small decode batch through every decoder layer in one C call (decoder.c)."""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from pagedchat.kernels.cpu.attention import _plan
from pagedchat.kernels.cpu.build import FLOAT, INT, P, declare, kernel
from pagedchat.kernels.cpu.linear import BLOCKED_ROWS, blocked_width

declare({"decoder_layers": (INT, [P, INT, P, P, P])})


class LayerTensors(NamedTuple):
    """One decoder layer's weights (as the model holds them: products packed) and caches."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


class _DecoderLayer(ctypes.Structure):
    """``DecoderLayer`` in ``decoder.c``."""

    _fields_ = [(name, P) for name in ("input_norm", "post_norm", "qkv", "qkv_bias", "o",
                                        "gate_up", "down")] + \
               [(name, INT) for name in ("qkv_padded", "o_padded", "gate_up_padded",
                                          "down_padded")] + \
               [("k_cache", P), ("v_cache", P)]


class _DecoderStep(ctypes.Structure):
    """``DecoderStep`` in ``decoder.c``."""

    _fields_ = [(name, INT) for name in ("rows", "hidden", "heads", "kv_heads", "head_dim",
                                          "intermediate", "block_size", "max_blocks",
                                          "attention_rows", "num_threads")] + \
               [("eps", FLOAT), ("scale", FLOAT)] + \
               [(name, P) for name in ("cos", "sin", "slots", "block_tables", "context_lens",
                                        "query_start", "row_ids", "row_seqs", "h", "qkv", "q",
                                        "attention", "gate_up", "act")]


class DecoderStack:
    """Every decoder layer of a model in one C call, for steps of up to
    ``BLOCKED_ROWS`` query rows that are all decodes or short chunks: the same kernels as
    the per-layer calls, in the same order (so the same result, bit for bit), without
    their Python dispatch. Built by :func:`decoder_stack`, which checks the weights."""

    def __init__(self, layers: list[LayerTensors], num_heads: int, eps: float,
                 scale: float) -> None:
        first = layers[0]
        self.hidden = first.input_norm.shape[0]
        self.heads = num_heads
        _, self.block_size, self.kv_heads, self.head_dim = first.k_cache.shape
        self.qkv_width = first.qkv.shape[0]
        self.intermediate = first.gate_up.shape[0] // 2
        self.eps, self.scale = eps, scale
        self.dtype = first.input_norm.dtype
        self._decoder = kernel("decoder_layers", first.input_norm)
        self._tensors = layers  # keeps what the pointers point at alive
        self._layers = (_DecoderLayer * len(layers))(*(
            _DecoderLayer(
                layer.input_norm.data_ptr(), layer.post_norm.data_ptr(),
                torch.ops.mkldnn.data_ptr(layer.qkv),
                None if layer.qkv_bias is None else layer.qkv_bias.data_ptr(),
                *(torch.ops.mkldnn.data_ptr(weight)
                  for weight in (layer.o, layer.gate_up, layer.down)),
                *(blocked_width(weight)
                  for weight in (layer.qkv, layer.o, layer.gate_up, layer.down)),
                layer.k_cache.data_ptr(), layer.v_cache.data_ptr())
            for layer in layers))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor,
                 query_start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last layer's output and the residual stream still to be added to it (as the
        layers return them), or None where this step is not one for the stack."""
        rows = x.shape[0]
        if rows not in BLOCKED_ROWS or x.dtype != self.dtype or cos.dtype != self.dtype:
            return None
        plan = _plan(block_tables, context_lens, query_start_loc)
        if plan.long_chunks:
            return None
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        slots = slot_mapping.to(torch.int64).contiguous()
        residual = torch.empty_like(x)
        q_size = self.heads * self.head_dim
        scratch = [torch.empty(rows, width, dtype=self.dtype) for width in (
            self.hidden, self.qkv_width, q_size, q_size, 2 * self.intermediate,
            self.intermediate)]
        step = _DecoderStep(
            rows, self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate,
            self.block_size, plan.tables.shape[1], len(plan.rows), torch.get_num_threads(),
            self.eps, self.scale, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.rows.data_ptr(), plan.row_seqs.data_ptr(),
            *(buffer.data_ptr() for buffer in scratch))
        status = self._decoder(
            self._layers, len(self._tensors), ctypes.byref(step), x.data_ptr(),
            residual.data_ptr())
        if status != 0:
            raise MemoryError("paged attention: out of memory for the score buffer")
        return x, residual


def decoder_stack(layers: list[LayerTensors], num_heads: int, eps: float,
                  scale: float) -> DecoderStack | None:
    """The layers as one C call where they can be: float32 or bfloat16 on the CPU, every
    product's weight packed in the blocked layout the C product reads, caches contiguous;
    else None (the model then calls its layers one by one)."""
    if not layers or kernel("decoder_layers", layers[0].input_norm) is None:
        return None
    dtype = layers[0].input_norm.dtype
    for layer in layers:
        products = (layer.qkv, layer.o, layer.gate_up, layer.down)
        plain = [layer.input_norm, layer.post_norm, layer.k_cache, layer.v_cache]
        if layer.qkv_bias is not None:
            plain.append(layer.qkv_bias)
        if not all(weight.is_mkldnn and weight.dtype == dtype
                   and blocked_width(weight) is not None for weight in products):
            return None
        if not all(tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous()
                   for tensor in plain):
            return None
    return DecoderStack(layers, num_heads, eps, scale)
