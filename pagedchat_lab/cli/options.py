"""The options the bench subcommands share, checked as Typer reads them: a shell reads every
option it takes from this one module (those all commands share are re-exported from
``pagedchat.cli.options``)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pagedchat.cli.options import (
    BlockSize,
    JsonPath,
    KvBlocks,
    KvMemory,
    Model,
    TensorParallelSize,
    Weights,
)
from pagedchat.engine.config import DTYPE_NAMES
from pagedchat.engine.presets import PRESETS

if TYPE_CHECKING:
    from pagedchat_lab.suite import EngineOptions

__all__ = ["MAX_SEQS", "BlockSize", "Compare", "DType", "DTypeOption", "HfBatch", "HfPage",
           "HfRequests", "JsonPath", "KvBlocks", "KvMemory", "MaxSeqs", "MaxTokens", "Model",
           "NumRequests", "Plot", "Rates", "Seed", "TensorParallelSize", "Weights",
           "check_sizes", "engine_options"]


DType = Enum("DType", {name: name for name in DTYPE_NAMES}, type=str)


def _check_peers(value: str) -> str:
    from pagedchat_lab.peers import parse_peers
    try:
        parse_peers(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    return value


def _positive_list(value: str, kind: type, what: str, example: str) -> str:
    from pagedchat_lab.suite import parse_list
    try:
        items = parse_list(value, kind)
    except ValueError as error:
        raise typer.BadParameter(f"not a list of {what}: {value!r}") from error
    if not items or min(items) <= 0:
        raise typer.BadParameter(f"give one or more positive {what}, e.g. {example}")
    return value


def _check_numbers(value: str) -> str:
    return _positive_list(value, float, "numbers", "0.5,1,2 (inf: all at once)")


def check_sizes(value: str) -> str:
    return _positive_list(value, int, "whole numbers", "8,16,32")


NumRequests = Annotated[int, typer.Option("-n", "--num-requests", min=1,
                                          help="Requests sampled from the trace.")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", min=1,
                                               help="Cap every output length.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the request sample and arrivals.")]
MAX_SEQS = PRESETS["bench"].max_num_seqs
MaxSeqs = Annotated[int, typer.Option("--max-num-seqs", min=1, help="Most sequences per step.")]
DTypeOption = Annotated[DType, typer.Option("--dtype", help="Weights and KV cache dtype.")]
Compare = Annotated[str, typer.Option(
    "--compare", callback=_check_peers,
    help="Peers to run too: hf-generate,hf-continuous, llama.cpp (batched, on the same GGUF; "
         "needs the [peers] extra), vllm-cpu (throughput only; see --vllm-python), or "
         "pagedchat-DTYPE (pagedchat in another dtype, e.g. "
         "pagedchat-float32).")]
HfBatch = Annotated[str, typer.Option(
    "--hf-batch-size", callback=check_sizes,
    help="Static batch sizes for hf-generate (the best is kept).")]
HfRequests = Annotated[str, typer.Option(
    "--hf-max-requests", callback=check_sizes,
    help="Requests per batch for hf-continuous (the best is kept).")]
HfPage = Annotated[int, typer.Option("--hf-page-size", min=4,
                                     help="hf-continuous page size in tokens.")]
Rates = Annotated[str, typer.Option("--rate", callback=_check_numbers,
                                    help="Request rates (req/s), e.g. 0.5,1,2; inf = all at once.")]
Plot = Annotated[Path, typer.Option("--plot", help="Where to write the PNG.")]


def engine_options(model, dtype, block_size=16, kv_blocks=None, kv_memory=None,
                   max_num_seqs=MAX_SEQS, tp=1, weights=None,
                   kv_cache_dtype="auto") -> EngineOptions:
    """The engine a bench builds from its command line."""
    from pagedchat_lab.suite import EngineOptions
    return EngineOptions(model=model, block_size=block_size, num_kv_blocks=kv_blocks,
                         kv_cache_memory=kv_memory, max_num_seqs=max_num_seqs,
                         dtype=DType(dtype).value, tensor_parallel_size=tp, weights=weights,
                         kv_cache_dtype=kv_cache_dtype)
