"""What every model of the engine does the same way around its layers."""

from __future__ import annotations

from torch import nn

from pagedchat.engine.layers.linear import Linear


class CausalLM(nn.Module):
    """A decoder with ``embed_tokens`` (an :class:`Embedding`), ``tied`` when the head reads
    the embedding's table, and :class:`Linear` products anywhere in its modules."""

    @property
    def vocab_rows(self) -> int:
        """This worker's rows of the vocabulary: the width of its logits."""
        return self.embed_tokens.rows

    def pack(self) -> None:
        """Lay the products' weights out for the kernels, after loading; the embedding's
        too where the head reads it."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        if self.tied:
            self.embed_tokens.pack()
