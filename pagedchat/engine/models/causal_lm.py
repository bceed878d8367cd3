"""What every model of the engine does the same way around its layers."""

from __future__ import annotations

from torch import nn

from pagedchat.engine.layers.linear import Linear, fuse_rows
from pagedchat.engine.loading.gguf_weights import Weight


class CausalLM(nn.Module):
    """A decoder with ``embed_tokens`` (an :class:`Embedding`), ``tied`` when the head reads
    the embedding's table, else its own ``lm_head``, layers with a ``self_attn`` (fused
    ``qkv_proj``, ``o_proj``) and an ``mlp`` (fused ``gate_up_proj``, ``down_proj``), and
    :class:`Linear` products anywhere in its modules."""

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

    def load_products(self, layer: nn.Module, prefix: str, tensors: dict[str, Weight]) -> None:
        """Take one layer's projections from a transformers-named state dict (popped): q/k/v
        and gate/up fused, this worker's shard of each (output rows of the column-parallel
        ones, input columns of o and down)."""
        shard = self.tp.shard
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj.load(fuse_rows(
            [shard(tensors.pop(prefix + f"self_attn.{n}_proj.weight")) for n in "qkv"]))
        mlp.gate_up_proj.load(fuse_rows(
            [shard(tensors.pop(prefix + f"mlp.{n}_proj.weight")) for n in ("gate", "up")]))
        attn.o_proj.load(shard(tensors.pop(prefix + "self_attn.o_proj.weight"), dim=1))
        mlp.down_proj.load(shard(tensors.pop(prefix + "mlp.down_proj.weight"), dim=1))

    def load_head(self, tensors: dict[str, Weight]) -> None:
        """Take this worker's rows of ``lm_head.weight`` where the head is not tied (a tied
        checkpoint's copy is dropped), the last of the state dict: a weight left over is an
        error."""
        head = tensors.pop("lm_head.weight", None)
        if self.lm_head is not None:
            if head is None:
                raise KeyError("lm_head.weight (the model's head is not tied to its embeddings)")
            self.lm_head.load(head[self.embed_tokens.start:self.embed_tokens.end])
        if tensors:
            raise KeyError(f"unexpected weights: {', '.join(sorted(tensors)[:5])}")
