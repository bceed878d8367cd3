"""The gated MLP over this worker's intermediate columns: SiLU-and-multiply, or Gemma's
GeGLU (tanh-approximated GELU-and-multiply)."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.linear import Linear
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class MLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: column-parallel gate/up (one fused product),
    row-parallel down projection; ``activation`` names the kernel that applies ``act`` and
    the product (``silu_mul`` or ``gelu_tanh_mul``)."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel,
                 activation: str = "silu_mul") -> None:
        super().__init__()
        self.tp, self.kernels = tp, kernels
        self.activation = activation
        self.intermediate = config.intermediate_size // tp.size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, False, kernels)
        self.down_proj = Linear(self.intermediate, config.hidden_size, False, kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = getattr(self.kernels, self.activation)(self.gate_up_proj(x))
        return self.tp.all_reduce(self.down_proj(h))
