"""PagedAttention in plain PyTorch, and the small operations of a decoder layer around it
(RMSNorm, rotary embedding, SiLU-and-multiply) as transformers computes them: the
definition of what is right for every backend.

KV cache layout (shared by every kernel), per layer:
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
in the activations' type, or int8 rows with their scales, ``head_dim + 2`` wide (see
``kv_int8.py``), which every operation here reads and writes through the same functions.
A token's slot is ``block_id * block_size + offset``. Block tables are int32
``[num_seqs, max_blocks_per_seq]`` padded with -1."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedchat.kernels.kv_int8 import dequantize, quantize
from pagedchat.kernels.quant import quantized_embedding, quantized_linear

__all__ = ["copy_blocks", "embedding", "first_key", "gather_kv", "gelu_tanh_mul", "linear",
           "max_logsumexp", "pack_embedding", "pack_linear", "paged_attention", "prepare",
           "quantized_embedding", "quantized_linear", "rms_norm", "rotary", "rotary_store",
           "screen_candidates", "silu_mul", "split_rotary", "store_kv", "swap_blocks",
           "write_slots"]


def prepare() -> None:
    """Nothing to begin: torch's operations are ready."""


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` rows ``[num_tokens, num_kv_heads, head_dim]`` into their slots.

    A slot of -1 means "skip this row" (padding)."""
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    write_slots(key, value, k_cache, v_cache, slot_mapping.long().to(k_cache.device))


def write_slots(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write every row of ``key``/``value`` to its (valid, int64) slot, quantized where
    the cache holds int8 rows."""
    if k_cache.dtype == torch.int8:
        key, value = quantize(key), quantize(value)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int,
              first: int = 0) -> torch.Tensor:
    """The cached rows ``first .. context_len - 1`` of one sequence, ``[context_len - first,
    kv_heads, dim]`` (de-quantized to float32 from an int8 cache); the table is read from
    the block of ``first`` on."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    skipped = first // block_size
    blocks = block_table[skipped:num_blocks].long()
    rows = cache[blocks].reshape(-1, *cache.shape[2:])[first - skipped * block_size:
                                                       context_len - skipped * block_size]
    return dequantize(rows) if cache.dtype == torch.int8 else rows


def first_key(context_len: int, q_len: int, window: int | None) -> int:
    """The first key a chunk of ``q_len`` queries ending the context reads: its first
    query's window's (0 without a window)."""
    return 0 if window is None else max(context_len - q_len - window + 1, 0)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, *,
                    max_query_len: int | None = None, max_context_len: int | None = None,
                    window: int | None = None) -> torch.Tensor:
    """Causal attention of a chunk of new queries per sequence over its paged cache.

    ``query`` is ``[num_tokens, num_heads, head_dim]``; sequence ``i`` owns rows
    ``query_start_loc[i]:query_start_loc[i+1]``. Those ``q_len`` queries are the last
    positions of its context, ``context_lens[i] - q_len .. context_lens[i] - 1``, and
    their K/V are already stored in the cache. Decode is the case ``q_len == 1``;
    a prefill chunk after a prefix-cache hit or an earlier chunk is ``q_len > 1``
    with cached tokens before it. Grouped-query heads share K/V heads.
    Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype.
    ``max_query_len`` / ``max_context_len``: the batch's largest query chunk and context
    where the caller knows them on the host, so that a device backend sizes its launch
    without reading the lengths back (a device sync); a host backend reads them itself.
    ``window``: a sliding window (Gemma 3's local layers): the query at position ``p``
    reads only the keys at ``p - window + 1 .. p``, and the block table's entries wholly
    before its chunk's first window may be holes, never read."""
    num_heads = query.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for i, context_len in enumerate(lens):
        q = query[starts[i] : starts[i + 1]]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        first = first_key(context_len, q_len, window)
        k = gather_kv(k_cache, block_tables[i], context_len, first).float()
        v = gather_kv(v_cache, block_tables[i], context_len, first).float()
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
        q_pos = torch.arange(context_len - q_len, context_len, device=query.device).unsqueeze(1)
        k_pos = torch.arange(first, context_len, device=query.device).unsqueeze(0)
        hidden = k_pos > q_pos
        if window is not None:
            hidden |= k_pos <= q_pos - window
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[i] : starts[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


def copy_blocks(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    """Copy-on-write: for every ``(src, dst)`` row of ``block_mapping`` ``[n, 2]``,
    copy block ``src`` into block ``dst`` in every layer, one batched call per layer."""
    if block_mapping.numel() == 0:
        return
    src = block_mapping[:, 0].long().to(k_caches[0].device)
    dst = block_mapping[:, 1].long().to(k_caches[0].device)
    for k_cache, v_cache in zip(k_caches, v_caches):
        k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
        v_cache.index_copy_(0, dst, v_cache.index_select(0, src))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Move blocks between pools (device <-> host): ``dst[d] = src[s]`` for each ``(s, d)``."""
    if block_mapping.numel() == 0:
        return
    rows = src.index_select(0, block_mapping[:, 0].long().to(src.device))
    dst.index_copy_(0, block_mapping[:, 1].long().to(dst.device), rows.to(dst.device))


def max_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of ``[rows, vocab]`` logits: the largest value, the first index holding it
    (``argmax``), and ``logsumexp``: the greedy token and the normaliser of its
    log-probability, all sampling needs from a row before any filtering. Logits of a lower
    precision are widened (exactly) to float32 first; the results are float32."""
    logits = logits.float()
    top, index = logits.max(dim=1)
    return top, index, logits.logsumexp(dim=1)


def screen_candidates(approx: torch.Tensor, norms: torch.Tensor, slack: torch.Tensor,
                      capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A greedy head's screen (engine/layers/greedy_head.py). Row r of ``approx``
    ``[rows, vocab]`` (float32) holds logits each known to within ``norms[j] * slack[r]``:
    the candidates are the ids whose interval reaches (or touches) the highest lower end of
    the row, ``max_j(approx[r, j] - norms[j] * slack[r])``, lowered by 2^-20 of the row's largest
    ``|approx[r, j]| + norms[j] * slack[r]`` (the float32 rounding of a compiled screen).
    The row's exact maximum is always one. Returns ``found`` ``[rows, capacity]`` int32,
    each row's first ``capacity`` candidates in increasing id, then -1; and ``counts``
    ``[rows]`` int32, how many each row has (more than ``capacity`` where it overflowed)."""
    values = approx.double()
    reach = slack.double().unsqueeze(1) * norms.double().unsqueeze(0)
    lowest = (values - reach).amax(dim=1) - 2.0 ** -20 * (values.abs() + reach).amax(dim=1)
    keep = values + reach >= lowest.unsqueeze(1)
    counts = keep.sum(dim=1, dtype=torch.int32)
    found = torch.full((approx.shape[0], capacity), -1, dtype=torch.int32)
    for r in range(approx.shape[0]):
        ids = keep[r].nonzero().flatten()[:capacity]
        found[r, :len(ids)] = ids.to(torch.int32)
    return found, counts


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm as transformers computes it (in float32, cast back before the weight).
    With ``residual``, ``x + residual`` is normalised instead. Returns the normalised rows
    and the rows normalised (the residual stream for the next addition)."""
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), x


def rotary_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
    """The step before attention: rotate the queries and keys of the fused QKV rows ``[tokens,
    (num_heads + 2 kv_heads) head_dim]``, store the rotated keys and the values in their slots (as
    :func:`store_kv`), and return the rotated queries ``[tokens, num_heads, head_dim]``."""
    q, k, v = split_rotary(qkv, cos, sin, num_heads, k_cache.shape[2])
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def split_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and keys rotated (in one call: they sit side by side), values as they are,
    each ``[tokens, heads, head_dim]``."""
    head_dim = cos.shape[-1]
    qk_size = (num_heads + num_kv_heads) * head_dim
    qk = rotary(qkv[:, :qk_size].view(-1, num_heads + num_kv_heads, head_dim), cos, sin)
    q, k = qk.split([num_heads, num_kv_heads], dim=1)
    return q, k, qkv[:, qk_size:].view(-1, num_kv_heads, head_dim)


def rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of ``qk`` ``[tokens, heads, head_dim]``
    with each token's ``cos``/``sin`` rows ``[tokens, head_dim]``; a new tensor."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = qk.shape[-1] // 2
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    return qk * cos + rotated * sin


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for rows ``[gate | up]`` of the fused gate/up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    # the product in place: one [tokens, width] buffer instead of two
    return F.silu(gate).mul_(up)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` (GELU's tanh approximation, Gemma's GeGLU) for rows
    ``[gate | up]`` of the fused gate/up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh").mul_(up)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)``: a linear layer's product, ``[rows, in] -> [rows, out]``.
    ``weight`` is a plain ``[out, in]`` tensor or what this backend's ``pack_linear`` made;
    the result is written into ``out`` (contiguous, of its shape and type) where given:
    the model's logits go to a buffer kept from step to step."""
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight in the layout this backend's ``linear`` reads fastest, done
    once when the model is loaded (here: unchanged)."""
    return weight


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The rows of ``weight`` for token ``ids``: ``[*ids.shape, width]``. ``weight`` is a
    plain ``[vocab, width]`` tensor or what this backend's ``pack_embedding`` made."""
    return F.embedding(ids, weight)


def pack_embedding(weight: torch.Tensor) -> torch.Tensor:
    """A weight that is both the embedding and the head (tied) in a layout that ``linear``
    and ``embedding`` both read, done once at load (here: unchanged)."""
    return weight
