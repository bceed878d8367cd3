"""Our own transformer implementations: the Llama family (Qwen 3 with its QK-norm) and Gemma 3."""

from __future__ import annotations

from torch import nn

from pagedchat.engine.model_config import ModelConfig


def model_class(config: ModelConfig) -> type[nn.Module]:
    """The implementation of the config's model type."""
    if config.model_type == "gemma3_text":
        from pagedchat.engine.models.gemma3 import Gemma3ForCausalLM

        return Gemma3ForCausalLM
    from pagedchat.engine.models.llama import LlamaForCausalLM, Qwen3ForCausalLM

    return Qwen3ForCausalLM if config.model_type == "qwen3" else LlamaForCausalLM
