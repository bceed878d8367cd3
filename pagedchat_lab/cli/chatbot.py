"""`pagedchat bench chatbot`: the paper's chatbot workload at each request rate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def chatbot(num_requests: opt.NumRequests = 100, model: opt.Model = None,
            max_tokens: opt.MaxTokens = 1024,
            context: Annotated[int, typer.Option("--context", min=16,
                                                 help="Keep the prompt's last N tokens.")] = 1024,
            rate: opt.Rates = "0.5,1,2", compare: opt.Compare = "",
            hf_batch_size: opt.HfBatch = "8",
            hf_page_size: opt.HfPage = 256, seed: opt.Seed = 0, block_size: opt.BlockSize = 16,
            kv_blocks: opt.KvBlocks = None, kv_memory: opt.KvMemory = None,
            max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
            weights: opt.Weights = None,
            plot: opt.Plot = Path("bench-chatbot.png"), json_path: opt.JsonPath = None,
            tp: opt.TensorParallelSize = 1) -> None:
    """The paper's chatbot: multi-turn history + new message, last 1024 tokens kept."""
    from pagedchat_lab import sharegpt
    from pagedchat_lab.online import serve_rates
    from pagedchat_lab.peers import parse_peers
    from pagedchat_lab.suite import length_limit, parse_list
    with user_errors():
        options = opt.engine_options(model, dtype, block_size, kv_blocks, kv_memory,
                                     max_num_seqs, tp, weights=weights)
        serve_rates("chatbot", options,
               lambda engine: sharegpt.sample_chat_requests(
                   engine.tokenizer, num_requests, seed, context, max_tokens or 1024,
                   max_total_len=length_limit(engine)),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)
