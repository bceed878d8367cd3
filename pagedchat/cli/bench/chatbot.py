"""`pagedchat bench chatbot`: the paper's chatbot workload at each request rate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.bench import sharegpt
from pagedchat.bench.online import serve_rates
from pagedchat.bench.suite import (
    length_limit,
    parse_list,
    parse_peers,
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


def chatbot(num_requests: NumRequests = 100, model: Model = None, max_tokens: MaxTokens = 1024,
            context: Annotated[int, typer.Option("--context", min=16,
                                                 help="Keep the prompt's last N tokens.")] = 1024,
            rate: Rates = "0.5,1,2", compare: Compare = "", hf_batch_size: HfBatch = "8",
            hf_page_size: HfPage = 256, seed: Seed = 0, block_size: BlockSize = 16,
            kv_blocks: KvBlocks = None, kv_memory: KvMemory = None,
            max_num_seqs: MaxSeqs = MAX_SEQS, dtype: Dtype = DType.float32,
            weights: Weights = None,
            plot: Plot = Path("bench-chatbot.png"), json_path: JsonPath = None,
            tp: TensorParallelSize = 1) -> None:
    """The paper's chatbot: multi-turn history + new message, last 1024 tokens kept."""
    with user_errors():
        options = engine_options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp,
                                 weights=weights)
        serve_rates("chatbot", options,
               lambda engine: sharegpt.sample_chat_requests(
                   engine.tokenizer, num_requests, seed, context, max_tokens or 1024,
                   max_total_len=length_limit(engine)),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)
