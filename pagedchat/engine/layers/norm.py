"""RMSNorm, with the residual add before it folded in; Gemma's, scaled by ``1 + w``."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: ModuleType) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.kernels = eps, kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised rows of ``x`` (of ``x + residual`` when given) and the rows
        normalised: the residual stream the layer adds to next."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        self.weight.copy_(w)


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the normalised rows times ``1 + w``. Checkpoints store ``w``; ``load`` keeps
    ``1 + w`` (added in float32, as transformers does), so the forward is the shared kernel's."""

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        self.weight.copy_(1.0 + w.float())
