"""A Llama-family decoder (Llama, SmolLM, Mistral, Qwen2, Phi-3) composed of the engine's layers.

Attention reads and writes K/V only through :mod:`pagedchat.kernels`, with the batch's
attention metadata passed in, so one forward serves prefill chunks and decodes of many
sequences at once; so do the small operations between the products (RMSNorm with its
residual add, rotary embedding with the K/V store, SiLU-and-multiply). Under tensor
parallelism each worker builds the same model with its share of the heads, MLP columns and
vocabulary (:mod:`pagedchat.engine.parallel`)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.attention import Attention, AttentionMetadata
from pagedchat.engine.layers.mlp import MLP
from pagedchat.engine.layers.norm import RMSNorm
from pagedchat.engine.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.models.causal_lm import CausalLM
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel,
                 qk_norm: type[RMSNorm] | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.self_attn = Attention(config, kernels, tp, qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.mlp = MLP(config, kernels, tp)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' ``residual + attn(norm(residual))`` then the same for the MLP, with
        each residual add folded into the norm after it: the layer takes and returns its
        sublayer output and the residual stream still to be added (none before layer 0)."""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, rope, meta), residual)
        return self.mlp(h), residual


class LlamaForCausalLM(CausalLM):
    """The embedding and the head hold this worker's rows of the vocabulary."""

    qk_norm: type[RMSNorm] | None = None  # each layer's attention's (Qwen 3's)

    def __init__(self, config: ModelConfig, kernels: ModuleType,
                 tp: TensorParallel | None = None) -> None:
        super().__init__(config, kernels, tp, lambda tp: [
            DecoderLayer(config, kernels, tp, self.qk_norm)
            for _ in range(config.num_hidden_layers)],
            RMSNorm(config.hidden_size, config.rms_norm_eps, kernels))
        self.rotary: RotaryEmbedding | None = None  # see build_rotary

    def build_rotary(self) -> None:
        """The rope's frequencies, on the current device. A separate step because the model
        is built on the meta device, where they would be empty."""
        self.rotary = RotaryEmbedding(*rope_parameters(self.config))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.lookup(positions, x.dtype)
        return self.run_layers(x, [rope], [meta], [(rope, meta)] * len(self.layers))

    def _build_stack(self, build: Callable) -> Callable:
        return build([
            self.kernels.LayerTensors(
                layer.input_layernorm.weight, layer.self_attn.qkv_proj.stored,
                layer.self_attn.qkv_proj.bias, layer.self_attn.o_proj.stored,
                layer.post_attention_layernorm.weight, layer.mlp.gate_up_proj.stored,
                layer.mlp.down_proj.stored, layer.self_attn.k_cache,
                layer.self_attn.v_cache, *_qk_norms(layer.self_attn))
            for layer in self.layers], self.layers[0].self_attn.num_heads,
            self.config.rms_norm_eps, self.layers[0].self_attn.scale)


def _qk_norms(attention: Attention) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The weights of the per-head norms of Q and K (Qwen 3's), or None where there are none."""
    if attention.q_norm is None:
        return None, None
    return attention.q_norm.weight, attention.k_norm.weight


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen 3: Llama's model with an RMSNorm over each head of Q and of K (QK-norm attention,
    which the CPU's decoder stack runs too)."""

    qk_norm = RMSNorm
    norms = (*LlamaForCausalLM.norms, "self_attn.q_norm", "self_attn.k_norm")
