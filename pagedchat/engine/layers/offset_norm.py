"""RMSNorm whose scale is ``1 + w`` (Gemma's), through the kernels' RMSNorm."""

from __future__ import annotations

import torch

from pagedchat.engine.layers.norm import RMSNorm


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the normalised rows times ``1 + w``. Checkpoints store ``w``; ``load`` keeps
    ``1 + w`` (added in float32, as transformers does), so the forward is the shared kernel's."""

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        self.weight.copy_(1.0 + w.float())
