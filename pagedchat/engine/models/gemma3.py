"""Gemma 3 (text): local layers over a sliding window, global ones over the whole context.

What sets it apart from Llama: RMSNorm with ``1 + w``, norms before and after both attention
and MLP, QK-norm, GeGLU with tanh GELU, embeddings scaled by ``sqrt(hidden)``, a query scale
of its own, a head_dim that is not hidden / heads, two rope tables (local and global bases)
and an optional soft cap on the final logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.kv_groups import LOCAL, kv_groups
from pagedchat.engine.layers.attention import Attention, AttentionMetadata
from pagedchat.engine.layers.mlp import MLP
from pagedchat.engine.layers.norm import OffsetRMSNorm
from pagedchat.engine.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.models.causal_lm import CausalLM
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class Gemma3Attention(Attention):
    """The engine's attention with the per-head norms of Q and K (``1 + w``) before rotary and the
    K/V store, and a query scale of its own; a local layer's metadata carries its window."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
        super().__init__(config, kernels, tp, OffsetRMSNorm)
        self.scale = float(config.query_pre_attn_scalar or self.head_dim) ** -0.5


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel,
                 local: bool) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.local = local
        self.input_layernorm = OffsetRMSNorm(size, eps, kernels)
        self.self_attn = Gemma3Attention(config, kernels, tp)
        self.post_attention_layernorm = OffsetRMSNorm(size, eps, kernels)
        self.pre_feedforward_layernorm = OffsetRMSNorm(size, eps, kernels)
        self.mlp = MLP(config, kernels, tp, "gelu_tanh_mul")
        self.post_feedforward_layernorm = OffsetRMSNorm(size, eps, kernels)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' ``r + post(attn(pre(r)))`` then the same for the MLP, each residual
        add folded into the norm after it, as in Llama's layer: it takes and returns its
        last sublayer's (post-normed) output and the residual stream still to be added."""
        h, residual = self.input_layernorm(x, residual)
        h, _ = self.post_attention_layernorm(self.self_attn(h, rope, meta))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        h, _ = self.post_feedforward_layernorm(self.mlp(h))
        return h, residual


class Gemma3ForCausalLM(CausalLM):
    """The embedding and the head hold this worker's rows of the vocabulary; the head is
    the embedding's (tied) unless the checkpoint has its own."""

    norms = ("self_attn.q_norm", "self_attn.k_norm", "input_layernorm",
             "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")

    def __init__(self, config: ModelConfig, kernels: ModuleType,
                 tp: TensorParallel | None = None) -> None:
        if config.attn_logit_softcapping is not None:
            raise ValueError("Gemma 3 configs with attn_logit_softcapping are not supported")
        if not config.sliding_window:
            raise ValueError("a Gemma 3 config needs its sliding_window")
        if tp is not None and config.num_key_value_heads % tp.size:
            raise ValueError(f"{config.num_key_value_heads} KV heads cannot be split "
                             f"over {tp.size} workers")
        super().__init__(config, kernels, tp, lambda tp: [
            Gemma3DecoderLayer(config, kernels, tp, kind == LOCAL)
            for kind in config.layer_types],
            OffsetRMSNorm(config.hidden_size, config.rms_norm_eps, kernels))
        self.rotary: dict[str, RotaryEmbedding] = {}  # "full" and "local": see build_rotary
        self.kv_groups = kv_groups(config)

    def build_rotary(self) -> None:
        """The global layers' rope and the local layers' one, on the current device (the
        model is built on meta)."""
        self.rotary = {
            "full": RotaryEmbedding(*rope_parameters(self.config, layer_type="full_attention")),
            "local": RotaryEmbedding(*rope_parameters(
                self.config, self.config.local_rope_parameters, LOCAL))}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                group_metas: list[AttentionMetadata] | None = None) -> torch.Tensor:
        """``group_metas``: per layer group (see ``engine/kv_groups.py``) the slots and block
        tables its layers store and read through; None when there is one group (``meta``)."""
        x = self.embed_tokens(input_ids)
        normalizer = torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32)
        x = x * normalizer.to(x.dtype)
        full_rope = self.rotary["full"].lookup(positions, x.dtype)
        local_rope = self.rotary["local"].lookup(positions, x.dtype)
        metas = [dataclasses.replace(m, window=window) for m, window in
                 zip(group_metas or [meta], self.kv_groups.windows, strict=True)]
        return self.run_layers(
            x, [full_rope, local_rope], metas,
            [(local_rope if layer.local else full_rope, metas[group])
             for layer, group in zip(self.layers, self.kv_groups.layer_group, strict=True)])

    def _build_stack(self, build: Callable) -> Callable:
        """Rope tables full then local, one metadata per layer group."""
        return build(
            [self._layer_tensors(layer, group)
             for layer, group in zip(self.layers, self.kv_groups.layer_group, strict=True)],
            self.layers[0].self_attn.num_heads, self.config.rms_norm_eps,
            self.layers[0].self_attn.scale, "gelu_tanh")

    def _layer_tensors(self, layer: Gemma3DecoderLayer, group: int):
        """One layer as the stack takes it, with its own rope table and group."""
        attn, mlp = layer.self_attn, layer.mlp
        return self.kernels.LayerTensors(
            layer.input_layernorm.weight, attn.qkv_proj.stored, attn.qkv_proj.bias,
            attn.o_proj.stored, layer.pre_feedforward_layernorm.weight,
            mlp.gate_up_proj.stored, mlp.down_proj.stored, attn.k_cache, attn.v_cache,
            attn.q_norm.weight, attn.k_norm.weight, layer.post_attention_layernorm.weight,
            layer.post_feedforward_layernorm.weight, rope=int(layer.local), group=group)
