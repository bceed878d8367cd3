"""Linear: a product with a weight, through the kernels."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn


class Linear(nn.Linear):
    """``nn.Linear``'s parameters, the kernels' product. The one place a linear weight is held
    and multiplied, so that another weight format changes only this class."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 kernels: ModuleType) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T (+ bias)``, written into ``out`` where given."""
        return self.kernels.linear(x, self.weight, self.bias, out=out)

    def pack(self) -> None:
        """Lay the weight out as the kernels' product reads it fastest (after loading: the
        packed layout may be opaque, e.g. oneDNN's, and takes no more copies)."""
        self.weight = nn.Parameter(self.kernels.pack_linear(self.weight.detach()),
                                   requires_grad=False)
