"""What every model of the engine does the same way around its layers."""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import accumulate
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.attention import AttentionMetadata
from pagedchat.engine.layers.embedding import Embedding
from pagedchat.engine.layers.greedy_head import GreedyHead
from pagedchat.engine.layers.linear import Linear, fuse_rows
from pagedchat.engine.layers.rotary import Rope
from pagedchat.engine.loading.gguf_weights import Weight
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class CausalLM(nn.Module):
    """A decoder: ``embed_tokens`` (an :class:`Embedding`; the head when ``tied``, else
    ``lm_head``), layers with a ``self_attn`` (fused ``qkv_proj``, ``o_proj``) and an ``mlp``
    (fused ``gate_up_proj``, ``down_proj``) of :class:`Linear` products, a final ``norm``."""

    greedy_head: GreedyHead | None = None  # see pack
    # each layer's norms, by their names in the layer (and in the checkpoint)
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    quantized = False  # whether a product's weight is loaded quantized
    # the backend's call through every layer, and the caches it was built on (decoder_stack)
    _stack: Callable | None = None
    _stack_caches: torch.Tensor | None = None

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel | None,
                 layers: Callable[[TensorParallel], list[nn.Module]], norm: nn.Module) -> None:
        """The parts every family has; ``layers`` builds the decoder layers for ``tp``."""
        super().__init__()
        self.config, self.kernels = config, kernels
        self.tp = tp = tp or TensorParallel()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, kernels, tp)
        self.layers = nn.ModuleList(layers(tp))
        self.norm = norm
        self.tied = config.tie_word_embeddings
        self.lm_head = (None if self.tied else
                        Linear(config.hidden_size, self.vocab_rows, False, kernels))

    def run_layers(self, x: torch.Tensor, ropes: list[Rope], metas: list[AttentionMetadata],
                   per_layer: list[tuple[Rope, AttentionMetadata]]) -> torch.Tensor:
        """``x`` through every layer, the last residual added: in one call of the backend's
        stack where there is one (``ropes``: its tables, ``metas``: one per layer group),
        else layer by layer, each with its rope and metadata of ``per_layer``."""
        stack = self.decoder_stack()
        stacked = None if stack is None else stack(
            x, ropes, [(m.slot_mapping, m.block_tables, m.context_lens, m.query_start_loc,
                        m.window) for m in metas])
        if stacked is not None:
            x, residual = stacked
        else:
            residual = None
            for layer, (rope, meta) in zip(self.layers, per_layer, strict=True):
                x, residual = layer(x, residual, rope, meta)
        return x + residual

    def decoder_stack(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor] | None] | None:
        """The backend's call through every layer at once (the CPU's, for small decode batches),
        where it has one and the model is whole on this worker; else None. Built by ``_build_stack``
        on first use, after the caches are in place, and again if they change."""
        build = getattr(self.kernels, "decoder_stack", None)
        if build is None or self.tp.size > 1:
            return None
        caches = self.layers[0].self_attn.k_cache
        if self._stack_caches is not caches:
            self._stack_caches = caches
            self._stack = self._build_stack(build)
        return self._stack

    def _build_stack(self, build: Callable) -> Callable:
        """The family's layers handed to the backend's ``decoder_stack`` builder."""
        raise NotImplementedError

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
        head = (self.embed_tokens if self.tied else self.lm_head).quantized
        # a soft-cap's tanh rounds logits far below the largest to its value (equal maxima)
        if (self.tp.size == 1 and GreedyHead.supports(head)
                and self.config.final_logit_softcapping is None
                and head.segments[0].data.is_cpu):
            self.greedy_head = GreedyHead(head, self.kernels)

    def compute_logits(self, hidden: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits of the sampled rows only, in the model's dtype (the sampler reads bfloat16 as
        it is), soft-capped where the config says so, gathered on rank 0 (None elsewhere).
        ``out``: where to write this worker's ``[rows, vocab rows]`` (see ``vocab_rows``)."""
        hidden, _ = self.norm(hidden)
        head = self.embed_tokens.logits if self.tied else self.lm_head
        logits = head(hidden, out=out)
        cap = self.config.final_logit_softcapping
        if cap is not None:  # in place, in the buffer
            logits.div_(cap).tanh_().mul_(cap)
        return self.tp.gather_columns(logits, self.config.vocab_size)

    def greedy_tokens(self, hidden: torch.Tensor,
                      out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The greedy token (first index of the largest logit) of each row, int64 (None off
        rank 0): through the greedy head's screen where there is one, the rows are float32 and
        it proved faster at this size, else from the whole logits (into ``out``)."""
        head = self.greedy_head
        if head is None or hidden.dtype != torch.float32:
            return self._argmax(hidden, out)
        screen = head.way.screen(len(hidden))
        started = time.perf_counter()
        tokens = (head.tokens(self.norm(hidden)[0], out) if screen else self._argmax(hidden, out))
        head.way.took(len(hidden), screen, time.perf_counter() - started)
        return tokens

    def _argmax(self, hidden: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor | None:
        logits = self.compute_logits(hidden, out)
        return None if logits is None else logits.argmax(dim=1)

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: dict[str, Weight]) -> None:
        """Take a transformers-named state dict (emptied): each layer's products (see
        :meth:`load_products`) and norms, the embedding, the final norm and the head.
        Quantized weights stay quantized."""
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            self.load_products(layer, prefix, tensors)
            for name in self.norms:
                layer.get_submodule(name).load(tensors.pop(f"{prefix}{name}.weight"))
        self.embed_tokens.load(tensors.pop("model.embed_tokens.weight"))
        self.norm.load(tensors.pop("model.norm.weight"))
        self.load_head(tensors)
        self.quantized = any(isinstance(m, Linear) and m.quantized is not None
                             for m in self.modules())

    def load_products(self, layer: nn.Module, prefix: str, tensors: dict[str, Weight]) -> None:
        """Take one layer's projections from a transformers-named state dict (popped): q/k/v and
        gate/up fused, this worker's shard of each (output rows of the column-parallel ones, input
        columns of o and down). A checkpoint that fuses them itself (Phi-3's ``qkv_proj`` and
        ``gate_up_proj``) is cut into its parts first. The q/k/v biases where the layer has them:
        zeros where the checkpoint has none (Qwen2's config implies them)."""
        shard, config = self.tp.shard, self.config
        attn, mlp = layer.self_attn, layer.mlp
        q_rows = config.num_attention_heads * config.head_dim
        kv_rows = config.num_key_value_heads * config.head_dim
        qkv = _parts(tensors, prefix + "self_attn.", "qkv_proj", ("q_proj", "k_proj", "v_proj"),
                     (q_rows, kv_rows, kv_rows))
        gate_up = _parts(tensors, prefix + "mlp.", "gate_up_proj", ("gate_proj", "up_proj"),
                         (config.intermediate_size, config.intermediate_size))
        attn.qkv_proj.load(fuse_rows([shard(part) for part in qkv]))
        mlp.gate_up_proj.load(fuse_rows([shard(part) for part in gate_up]))
        attn.o_proj.load(shard(tensors.pop(prefix + "self_attn.o_proj.weight"), dim=1))
        mlp.down_proj.load(shard(tensors.pop(prefix + "mlp.down_proj.weight"), dim=1))
        if attn.qkv_proj.bias is not None:
            biases = [tensors.pop(f"{prefix}self_attn.{n}_proj.bias", None) for n in "qkv"]
            if any(b is None for b in biases):
                attn.qkv_proj.bias.zero_()
            else:
                attn.qkv_proj.bias.copy_(torch.cat([shard(b) for b in biases]))

    def load_head(self, tensors: dict[str, Weight]) -> None:
        """Take this worker's rows of an untied ``lm_head.weight`` (a tied checkpoint's copy is
        dropped), the last of the state dict: a weight left over is an error."""
        head = tensors.pop("lm_head.weight", None)
        if self.lm_head is not None:
            if head is None:
                raise KeyError("lm_head.weight (the model's head is not tied to its embeddings)")
            self.lm_head.load(head[self.embed_tokens.start:self.embed_tokens.end])
        if tensors:
            raise KeyError(f"unexpected weights: {', '.join(sorted(tensors)[:5])}")


def _parts(tensors: dict[str, Weight], prefix: str, fused: str, names: tuple[str, ...],
           rows: tuple[int, ...]) -> list[Weight]:
    """The weights ``names`` under ``prefix`` (popped), or, where the checkpoint holds them
    as one ``fused`` weight, its consecutive blocks of ``rows`` rows."""
    if (weight := tensors.pop(f"{prefix}{fused}.weight", None)) is None:
        return [tensors.pop(f"{prefix}{name}.weight") for name in names]
    if weight.shape[0] != sum(rows):
        raise KeyError(f"{prefix}{fused}.weight has {weight.shape[0]} rows, not {sum(rows)}")
    ends = list(accumulate(rows))
    return [weight[end - size:end] for size, end in zip(rows, ends, strict=True)]
