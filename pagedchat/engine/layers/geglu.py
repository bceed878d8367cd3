"""The gated MLP with tanh-approximated GELU (GeGLU), over this worker's columns."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.linear import Linear
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class GeGLU(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``: column-parallel gate/up (one fused product),
    row-parallel down projection."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.kernels = kernels
        self.intermediate = config.intermediate_size // tp.size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, False, kernels)
        self.down_proj = Linear(self.intermediate, config.hidden_size, False, kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.kernels.gelu_tanh_mul(self.gate_up_proj(x))
        return self.tp.all_reduce(self.down_proj(h))
