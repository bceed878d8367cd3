"""A Llama-family decoder (Llama, SmolLM, Mistral, Qwen2) with paged attention.

Attention reads and writes K/V only through :mod:`pagedchat.kernels`; the batch's
attention metadata (slot mapping, block tables, context lengths) is passed in, so
one forward serves prefill chunks and decodes of many sequences at once. The small
operations between the matrix products (RMSNorm with the residual add before it, rotary
embedding with the K/V store, SiLU-and-multiply) come from the kernels too: the
reference computes them as transformers does, the CPU backend in one compiled pass each.

Under tensor parallelism (:mod:`pagedchat.engine.parallel`) each worker builds the same
model with its share of the heads, MLP columns and vocabulary; with one worker the
collectives are no-ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel import TensorParallel

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [tokens, head_dim]


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes and which cached tokens each query reads."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32, tokens in cache after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    max_query_len: int
    max_context_len: int


class Linear(nn.Linear):
    """``nn.Linear``'s parameters, the kernels' product (a few rows in C on the CPU)."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 kernels: ModuleType) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.weight, self.bias)

    def pack(self) -> None:
        """Lay the weight out as the kernels' product reads it fastest (after loading: the
        packed layout may be opaque, e.g. oneDNN's, and takes no more copies)."""
        self.weight = nn.Parameter(self.kernels.pack_linear(self.weight.detach()),
                                   requires_grad=False)


class Embedding(nn.Module):
    """The vocabulary's rows, looked up through the kernels. Where the head is tied to them
    they are packed for the head's product (``pack``), and the lookup reads that layout:
    one copy of the largest weight, in the form the step that reads all of it wants."""

    def __init__(self, rows: int, width: int, kernels: ModuleType) -> None:
        super().__init__()
        # torch.empty: a random init, run on the meta device, would import torch._dynamo
        # (about 140 MB resident) for nothing
        self.weight = nn.Parameter(torch.empty(rows, width))
        self.kernels = kernels

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.kernels.embedding(ids, self.weight)

    def pack(self) -> None:
        self.weight = nn.Parameter(self.kernels.pack_embedding(self.weight.detach()),
                                   requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: ModuleType) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised rows of ``x`` (of ``x + residual`` when given) and the rows
        normalised: the residual stream the layer adds to next."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed as transformers does (float32), looked up by position."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin rows for these positions; looked up once per step and shared by
        every layer."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class Attention(nn.Module):
    """Column-parallel QKV over this worker's heads, row-parallel output projection."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads // tp.size
        self.num_kv_heads = config.num_key_value_heads // tp.size
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                               config.attention_bias, kernels)
        self.o_proj = Linear(self.q_size, config.hidden_size, False, kernels)
        self.scale = self.head_dim**-0.5
        self.kernels = kernels
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        q = self.kernels.rotary_store(self.qkv_proj(x), *rope, self.num_heads, self.k_cache,
                                      self.v_cache, meta.slot_mapping)
        out = self.kernels.paged_attention(
            q, self.k_cache, self.v_cache, meta.block_tables, meta.context_lens,
            meta.query_start_loc, self.scale,
        )
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))


class MLP(nn.Module):
    """Column-parallel gate/up, row-parallel down projection."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.kernels = kernels
        self.intermediate = config.intermediate_size // tp.size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, False, kernels)
        self.down_proj = Linear(self.intermediate, config.hidden_size, False, kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.kernels.silu_mul(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.self_attn = Attention(config, kernels, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.mlp = MLP(config, kernels, tp)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' ``residual + attn(norm(residual))`` then the same for the MLP, with
        each residual add folded into the norm after it: the layer takes and returns its
        sublayer output and the residual stream still to be added (none before layer 0)."""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, rope, meta), residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    """The embedding and the head hold this worker's rows of the vocabulary."""

    def __init__(
        self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp = tp or TensorParallel()
        self.vocab_start, self.vocab_end = tp.part(config.vocab_size)
        rows = self.vocab_rows
        self.embed_tokens = Embedding(rows, config.hidden_size, kernels)
        self.layers = nn.ModuleList(
            DecoderLayer(config, kernels, tp) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.tied = config.tie_word_embeddings
        self.lm_head = None if self.tied else Linear(config.hidden_size, rows, False, kernels)
        self.kernels = kernels
        self.rotary: RotaryEmbedding | None = None  # see build_rotary
        self._stack = self._stack_caches = None  # see decoder_stack

    def pack(self) -> None:
        """Lay the products' weights out for the kernels, after loading; the embedding's
        too where the head reads it."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        if self.tied:
            self.embed_tokens.pack()

    def build_rotary(self, max_positions: int) -> None:
        """Compute the cos/sin tables, on the current device. A separate step because the
        model is built on the meta device, where the tables would be empty."""
        inv_freq, scaling = _rope_parameters(self.config)
        self.rotary = RotaryEmbedding(inv_freq, scaling, max_positions)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        rope = self.rotary.lookup(positions, x.dtype)
        stack = self.decoder_stack()
        stacked = None if stack is None else stack(
            x, *rope, meta.slot_mapping, meta.block_tables, meta.context_lens,
            meta.query_start_loc)
        if stacked is not None:
            x, residual = stacked
        else:
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual, rope, meta)
        return x + residual

    def decoder_stack(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor] | None] | None:
        """The backend's call through every layer at once (the CPU's, for small decode
        batches), where it has one and the model is whole on this worker; else None.
        Built on first use, after the caches are in place, and again if they change."""
        build = getattr(self.kernels, "decoder_stack", None)
        if build is None or self.tp.size > 1:
            return None
        caches = self.layers[0].self_attn.k_cache
        if self._stack_caches is not caches:
            self._stack_caches = caches
            self._stack = build([
                self.kernels.LayerTensors(
                    layer.input_layernorm.weight, layer.self_attn.qkv_proj.weight,
                    layer.self_attn.qkv_proj.bias, layer.self_attn.o_proj.weight,
                    layer.post_attention_layernorm.weight, layer.mlp.gate_up_proj.weight,
                    layer.mlp.down_proj.weight, layer.self_attn.k_cache,
                    layer.self_attn.v_cache)
                for layer in self.layers], self.layers[0].self_attn.num_heads,
                self.config.rms_norm_eps, self.layers[0].self_attn.scale)
        return self._stack

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel lookup: ids outside this worker's rows give zeros, and the
        all-reduce adds the one worker's row that holds each id (an exact sum)."""
        if self.tp.size == 1:
            return self.embed_tokens(input_ids)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = (input_ids - self.vocab_start).masked_fill(outside, 0)
        x = self.embed_tokens(local).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(x)

    def compute_logits(self, hidden: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits, in the model's dtype, for the rows that are sampled (and only those); under
        tensor parallelism the vocabulary blocks are gathered on rank 0 (None elsewhere).
        Not widened here: the sampler's reduction reads bfloat16 as it is. ``out``: where
        to write this worker's ``[rows, vocab rows]`` (see ``vocab_rows``)."""
        hidden, _ = self.norm(hidden)
        weight = self.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = self.kernels.linear(hidden, weight, out=out)
        return self.tp.gather_columns(logits, self.config.vocab_size)

    @property
    def vocab_rows(self) -> int:
        """This worker's rows of the vocabulary: the width of its logits."""
        return self.vocab_end - self.vocab_start

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a transformers-named state dict in, fusing q/k/v and gate/up, and keeping
        this worker's shard: output rows of column-parallel layers, input columns of
        row-parallel ones, rows of the vocabulary."""
        own = dict(self.named_parameters())
        shard = self.tp.shard
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [shard(tensors.pop(prefix + f"self_attn.{n}_proj.weight")) for n in "qkv"]
            attn.qkv_proj.weight.copy_(torch.cat(qkv))
            if attn.qkv_proj.bias is not None:
                biases = [tensors.pop(prefix + f"self_attn.{n}_proj.bias", None) for n in "qkv"]
                if all(b is not None for b in biases):
                    attn.qkv_proj.bias.copy_(torch.cat([shard(b) for b in biases]))
                else:
                    attn.qkv_proj.bias.zero_()
            gate_up = [shard(tensors.pop(prefix + f"mlp.{n}_proj.weight"))
                       for n in ("gate", "up")]
            mlp.gate_up_proj.weight.copy_(torch.cat(gate_up))
            for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                own[f"layers.{i}.{name}"].copy_(shard(tensors.pop(prefix + name), dim=1))
            for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
                own[f"layers.{i}.{name}"].copy_(tensors.pop(prefix + name))
        vocab = slice(self.vocab_start, self.vocab_end)
        own["embed_tokens.weight"].copy_(tensors.pop("model.embed_tokens.weight")[vocab])
        own["norm.weight"].copy_(tensors.pop("model.norm.weight"))
        head = tensors.pop("lm_head.weight", None)
        if self.lm_head is not None:
            if head is None:
                raise KeyError("lm_head.weight (the model's head is not tied to its embeddings)")
            self.lm_head.weight.copy_(head[vocab])
        if tensors:
            raise KeyError(f"unexpected weights: {', '.join(sorted(tensors)[:5])}")


def _rope_parameters(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """inv_freq and cos/sin scaling for the config's rope type, as transformers computes them.
    Scaled rope types (llama3, yarn, ...) take transformers' own formulas and config."""
    if config.rope_type == "default":
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if config.rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {config.rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[config.rope_type](
        AutoConfig.from_pretrained(config.folder))
    return inv_freq, float(scaling)
