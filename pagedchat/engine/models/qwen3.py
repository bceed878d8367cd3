"""Qwen 3: the Llama-family decoder with an RMSNorm over each head of Q and of K."""

from __future__ import annotations

import torch

from pagedchat.engine.layers.qk_norm import QKNormAttention
from pagedchat.engine.loading.gguf_weights import Weight
from pagedchat.engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Llama's model with QK-norm attention (which the CPU's decoder stack runs too)."""

    attention = QKNormAttention

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: dict[str, Weight]) -> None:
        """Llama's loading, with each layer's ``q_norm`` and ``k_norm`` taken first."""
        for i, layer in enumerate(self.layers):
            for name in ("q_norm", "k_norm"):
                norm = getattr(layer.self_attn, name)
                norm.weight.copy_(tensors.pop(f"model.layers.{i}.self_attn.{name}.weight"))
        super().load_hf_state_dict(tensors)
