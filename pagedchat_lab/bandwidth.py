"""How close a single-stream decode comes to the memory's speed.

A decode step at batch 1 reads every weight the token passes through once (the embedding
only as the tied head, where it is tied) and the KV cache of its context; it does little
else. Its tokens/s times those bytes, against the machine's measured copy bandwidth, says
what share of the memory's speed the engine reaches. The copy bandwidth counts each byte
read and each byte written, as STREAM's Copy does, and is the best of a few copies of a
buffer far larger than the caches, on torch's threads (every core it uses).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from pagedchat import console

# each of the two buffers: far larger than a CPU's caches, small next to its memory
COPY_BYTES = 256 << 20


def copy_bandwidth(size: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes per second (read + written) of the best of ``repeats`` ``dst.copy_(src)``."""
    source = torch.ones(size // 4, dtype=torch.float32)  # written once: every page is mapped
    target = torch.zeros_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * size / best


def pagedchat_bytes_per_token(engine, context_len: float) -> int:
    """Bytes one decode step of one sequence reads: the weights as the engine holds them
    and the KV cache of ``context_len`` tokens, each layer group's."""
    runner = engine.runner
    weights = runner.weight_bytes
    model = runner.model
    if not model.tied:  # an untied embedding gives one row per token
        table = model.embed_tokens
        weights -= (table.quantized.nbytes if table.quantized is not None
                    else table.weight.numel() * table.weight.element_size())
    # a page holds one group's layers; a windowed group reads only its window
    tokens_read = sum(context_len if window is None else min(context_len, window)
                      for window in runner.kv_groups.windows)
    kv = runner.block_bytes * tokens_read / engine.config.block_size
    return int(weights + kv)


def gguf_bytes_per_token(path: Path, context_len: float, kv_bytes_per_value: int = 2) -> int:
    """Bytes llama.cpp reads per decode step of one sequence from a GGUF: its tensors as
    stored (the embedding only where it is the tied head) and the KV cache of
    ``context_len`` tokens (llama.cpp's default cache type, float16)."""
    from pagedchat.engine.loading.gguf_file import read_gguf_header

    header = read_gguf_header(path)
    tensors = {t.name: t.n_bytes for t in header.tensors}
    weights = sum(tensors.values())
    if "output.weight" in tensors:
        weights -= tensors["token_embd.weight"]
    arch = header.fields["general.architecture"]

    def field(name: str) -> int:
        return int(header.fields[f"{arch}.{name}"])

    head_dim = (field("attention.key_length") if f"{arch}.attention.key_length" in header.fields
                else field("embedding_length") // field("attention.head_count"))
    kv_width = field("attention.head_count_kv") * head_dim
    kv = 2 * field("block_count") * kv_width * kv_bytes_per_value * context_len
    return int(weights + kv)


def bandwidth_share(tokens_per_s: float, bytes_per_token: float, bandwidth: float) -> float:
    """Decode's bytes per second as a share of the copy bandwidth."""
    return tokens_per_s * bytes_per_token / bandwidth


def decode_shares(engine, figures: dict[str, dict[str, object]], context_len: float,
                  bandwidth: float) -> None:
    """Add each engine's bytes read per decode token and its share of ``bandwidth`` to
    its figures. transformers reads the weights pagedchat holds, in the same dtype."""
    ours = pagedchat_bytes_per_token(engine, context_len)
    for name, found in figures.items():
        size = (gguf_bytes_per_token(Path(engine.model_files.source), context_len)
                if name == "llama.cpp" else ours)
        found["bytes_per_token_mb"] = size / 1e6
        found["bandwidth_share"] = bandwidth_share(found["decode_tokens_per_s"], size, bandwidth)


def memory_speed(engine, figures: dict[str, dict[str, object]],
                 context_len: float) -> dict[str, float]:
    """Measure the copy bandwidth, add each engine's share of it to ``figures``, say how it
    was measured, and return it (GB/s) with the thread count."""
    bandwidth = copy_bandwidth()
    decode_shares(engine, figures, context_len, bandwidth)
    threads = torch.get_num_threads()
    console.note(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (bytes read + written, best of "
                 f"copies of {COPY_BYTES >> 20} MiB on {threads} threads); bandwidth_share = "
                 "decode tokens/s x bytes read per token (weights + KV cache) / that")
    return {"copy_bandwidth_gb_s": bandwidth / 1e9, "threads": threads}
