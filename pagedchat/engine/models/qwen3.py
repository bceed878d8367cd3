"""Qwen 3: the Llama-family decoder with an RMSNorm over each head of Q and of K."""

from __future__ import annotations

from pagedchat.engine.layers.qk_norm import QKNormAttention
from pagedchat.engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Llama's model with QK-norm attention (which the CPU's decoder stack runs too)."""

    attention = QKNormAttention
    norms = (*LlamaForCausalLM.norms, "self_attn.q_norm", "self_attn.k_norm")
