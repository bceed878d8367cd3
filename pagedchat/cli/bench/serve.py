"""`pagedchat bench serve`: online serving on ShareGPT at each request rate."""

from __future__ import annotations

from pathlib import Path

from pagedchat.bench.online import serve_rates
from pagedchat.bench.suite import (
    parse_list,
    parse_peers,
    sample_trace,
)
from pagedchat.cli.bench.options import (
    MAX_SEQS,
    Compare,
    DType,
    Dtype,
    HfBatch,
    HfPage,
    MaxSeqs,
    MaxTokens,
    NumRequests,
    Plot,
    Rates,
    Seed,
    engine_options,
)
from pagedchat.cli.options import (
    BlockSize,
    JsonPath,
    KvBlocks,
    KvMemory,
    Model,
    TensorParallelSize,
    Weights,
    user_errors,
)


def serve(num_requests: NumRequests = 200, model: Model = None, max_tokens: MaxTokens = None,
          rate: Rates = "0.5,1,2", compare: Compare = "", hf_batch_size: HfBatch = "8",
          hf_page_size: HfPage = 256, seed: Seed = 0, block_size: BlockSize = 16,
          kv_blocks: KvBlocks = None, kv_memory: KvMemory = None, max_num_seqs: MaxSeqs = MAX_SEQS,
          dtype: Dtype = DType.float32,
          weights: Weights = None, plot: Plot = Path("bench-serve.png"),
          json_path: JsonPath = None,
          tp: TensorParallelSize = 1) -> None:
    """Online serving: Poisson arrivals; TTFT, TPOT, ITL, e2e and normalized latency."""
    with user_errors():
        options = engine_options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp,
                                 weights=weights)
        serve_rates("serve", options,
               lambda engine: sample_trace(engine, num_requests, seed, max_tokens),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)
