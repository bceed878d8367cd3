"""Embedding: the vocabulary's rows, looked up, and read again by a tied head."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.linear import take_weight
from pagedchat.engine.parallel.tensor_parallel import TensorParallel
from pagedchat.kernels.quant import QuantizedWeight


class Embedding(nn.Module):
    """This worker's rows ``[start, end)`` of the vocabulary, looked up through the kernels:
    the one place the vocabulary's weight is held. A tied head's rows are packed for its
    product (``pack``) and the lookup reads that layout too; a table loaded quantized
    (``quantized``) stays in its blocks for both, and ``weight`` is then left empty."""

    def __init__(self, vocab_size: int, width: int, kernels: ModuleType,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.start, self.end = tp.part(vocab_size)
        # torch.empty: a random init on the meta device would import torch._dynamo
        self.weight = nn.Parameter(torch.empty(self.end - self.start, width))
        self.kernels = kernels
        self.quantized: QuantizedWeight | None = None

    @property
    def rows(self) -> int:
        """This worker's rows of the vocabulary: the width of its logits."""
        return self.end - self.start

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel lookup: ids outside this worker's rows give zeros, and the
        all-reduce adds the one worker's row that holds each id (an exact sum)."""
        if self.tp.size == 1:
            return self._lookup(ids)
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        x = self._lookup(local).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(x)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            # the emptied weight still follows the model's dtype (``.to``)
            return self.kernels.quantized_embedding(ids, self.quantized, self.weight.dtype)
        return self.kernels.embedding(ids, self.weight)

    def logits(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tied head: ``x`` against every row, written into ``out`` where given."""
        if self.quantized is not None:
            return self.kernels.quantized_linear(x, self.quantized, out=out)
        return self.kernels.linear(x, self.weight, out=out)

    @torch.no_grad()
    def load(self, weight: torch.Tensor | QuantizedWeight) -> None:
        """Take this worker's rows of the vocabulary from the whole table ``weight``: copied
        into ``weight``, or kept quantized (rows then given in the model's dtype)."""
        take_weight(self, weight[self.start:self.end])

    def pack(self) -> None:
        if self.quantized is not None:
            return
        self.weight = nn.Parameter(self.kernels.pack_embedding(self.weight.detach()),
                                   requires_grad=False)
