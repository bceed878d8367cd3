"""Linear: a product with a weight, through the kernels."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from pagedchat.kernels.quant import QuantizedWeight, dequantize


class Linear(nn.Linear):
    """``nn.Linear``'s parameters, the kernels' product. The one place a linear weight is held
    and multiplied, so that another weight format changes only this class: a weight loaded
    quantized (``quantized``) stays in its blocks, and ``weight`` is then left empty."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 kernels: ModuleType) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels
        self.quantized: QuantizedWeight | None = None

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T (+ bias)``, written into ``out`` where given."""
        if self.quantized is not None:
            return self.kernels.quantized_linear(x, self.quantized, self.bias, out=out)
        return self.kernels.linear(x, self.weight, self.bias, out=out)

    @property
    def stored(self) -> torch.Tensor | QuantizedWeight:
        """The weight as the product reads it: the quantized blocks where kept, else
        ``weight`` (packed after :meth:`pack`)."""
        return self.weight if self.quantized is None else self.quantized

    @torch.no_grad()
    def load(self, weight: torch.Tensor | QuantizedWeight) -> None:
        """Take ``weight`` (``[out, in]``): copied into ``weight``, or kept as it is where
        quantized (the placeholder ``weight`` is freed)."""
        take_weight(self, weight)

    def pack(self) -> None:
        """Lay the weight out as the kernels' product reads it fastest (after loading: the
        packed layout may be opaque, e.g. oneDNN's, and takes no more copies)."""
        if self.quantized is None:
            self.weight = nn.Parameter(self.kernels.pack_linear(self.weight.detach()),
                                       requires_grad=False)


def take_weight(module: nn.Module, weight: torch.Tensor | QuantizedWeight) -> None:
    """Copy ``weight`` into ``module.weight`` (of its shape, else KeyError), or keep it
    quantized in ``module.quantized`` and leave ``module.weight`` an empty placeholder."""
    if tuple(weight.shape) != tuple(module.weight.shape):
        raise KeyError(f"a weight of shape {tuple(weight.shape)} where "
                       f"{tuple(module.weight.shape)} was expected")
    if isinstance(weight, QuantizedWeight):
        module.quantized = weight
        module.weight = nn.Parameter(torch.empty(0), requires_grad=False)
    else:
        module.weight.copy_(weight)


def fuse_rows(parts: list[torch.Tensor | QuantizedWeight]) -> torch.Tensor | QuantizedWeight:
    """Weights stacked by rows (a fused projection): quantized ones without decoding; where
    only some are quantized, all as float32 (the exact values either way)."""
    if all(isinstance(part, QuantizedWeight) for part in parts):
        return QuantizedWeight.stack(parts)
    return torch.cat([dequantize(p) if isinstance(p, QuantizedWeight) else p for p in parts])
