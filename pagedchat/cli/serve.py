"""The ``pagedchat serve`` command (a thin shell over create_app and uvicorn)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.cli import options as opt
from pagedchat.engine.presets import PRESETS, SPECULATIVE_TOKENS, swap_space

SERVE = PRESETS["serve"]


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    model: opt.Model = None,
    served_model_name: Annotated[list[str] | None, typer.Option(
        help="The model's name in the API (default: the model file's or folder's name); "
             "repeat it for aliases, the first is the name answers carry. Each name is "
             "also answered to without its quantization suffix (.Q4_1, -Q4_K_M).")] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="PAGEDCHAT_API_KEY", help="Require 'Authorization: Bearer KEY'.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    kv_memory: Annotated[str | None, typer.Option(
        help="KV pool size in bytes, e.g. 2GiB (default: 2GiB).")] = None,
    kv_blocks: Annotated[int | None, typer.Option(min=1, help="KV pool size in blocks.")]
    = SERVE.num_kv_blocks,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Most sequences per step.")]
    = SERVE.max_num_seqs,
    max_num_batched_tokens: Annotated[int, typer.Option(
        min=1, help="Most tokens per step.")] = 1024,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    weights: opt.Weights = None, kv_cache_dtype: opt.KvCacheDtype = "auto",
    speculative: opt.Speculative = None,
    num_speculative_tokens: opt.NumSpeculativeTokens = SPECULATIVE_TOKENS,
    kv_store: Annotated[Path | None, typer.Option(
        help="Folder where finished requests' KV blocks are kept, read back by later prompts "
             "that start with them, after a restart too (a shared system prompt stays "
             "warm); default: none kept.")] = None,
    kv_store_cap: opt.KvStoreCap = "2GiB", tensor_parallel_size: opt.TensorParallelSize = 1,
    drain_timeout: Annotated[float, typer.Option(
        min=0, help="Seconds running requests get to finish after SIGTERM.")] = 30.0,
    log_prompts: Annotated[bool, typer.Option(
        help="Write prompt text to the log (off: only counts).")] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    max_request_bytes: Annotated[str, typer.Option(
        help="Largest request body, e.g. 1MiB; a larger one is refused (413) unread.")]
    = "1MiB",
    read_timeout: Annotated[float, typer.Option(
        min=0.1, help="Seconds a client may take to send its headers, and its body.")] = 30.0,
    max_concurrent_requests: Annotated[int, typer.Option(
        min=1, help="Completions running at once; past it a request gets 429.")] = 1024) -> None:
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, ...)."""
    import logging

    with opt.starting():
        from pagedchat.engine.config import EngineConfig, parse_bytes
        from pagedchat.server.serve import build_engine, run_server
        from pagedchat.server.state import ServerSettings

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")
    with opt.user_errors():
        body_limit = parse_bytes(max_request_bytes)
        engine = build_engine(EngineConfig(
            model=model, block_size=block_size, kv_cache_memory=kv_memory,
            num_kv_blocks=kv_blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, dtype=dtype, weights=weights,
            kv_cache_dtype=kv_cache_dtype, swap_space=swap_space("recompute"),
            tensor_parallel_size=tensor_parallel_size,
            speculative=speculative, num_speculative_tokens=num_speculative_tokens,
            kv_store=None if kv_store is None else str(kv_store), kv_store_cap=kv_store_cap))
    names = served_model_name or [Path(engine.model_files.source).name.removesuffix(".gguf")]
    if not served_model_name and model and Path(model).name == model and not Path(model).exists():
        names.append(model)  # a named model (gemma-3-270m) answers to that name too
    settings = ServerSettings(
        model_name=names[0], aliases=tuple(names[1:]), api_key=api_key,
        log_prompts=log_prompts, drain_timeout=drain_timeout, max_request_bytes=body_limit,
        read_timeout=read_timeout, max_concurrent_requests=max_concurrent_requests)
    try:
        with opt.user_errors():
            run_server(engine, settings, host, port, log_level.lower())
    finally:
        engine.shutdown()
