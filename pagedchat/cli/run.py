"""`pagedchat run`: one prompt answered on standard output (pipe friendly)."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from pagedchat.cli import options as opt
from pagedchat.engine.errors import RequestError
from pagedchat.engine.presets import PRESETS, SPECULATIVE_TOKENS, swap_space

RUN = PRESETS["run"]


def run(
    prompt: Annotated[str | None, typer.Argument(
        help="The question; '-' or nothing reads it from standard input.")] = None,
    model: opt.Model = None,
    system: Annotated[str | None, typer.Option(help="A system prompt.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most tokens to generate.")]
    = RUN.max_tokens,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass, in (0, 1].")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Makes a sampled answer repeat.")] = None,
    raw: Annotated[bool, typer.Option(help="Send the prompt as is, no chat template.")] = False,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    weights: opt.Weights = None, kv_blocks: opt.KvBlocks = None, kv_memory: opt.KvMemory = None,
    kv_cache_dtype: opt.KvCacheDtype = "auto", speculative: opt.Speculative = None,
    num_speculative_tokens: opt.NumSpeculativeTokens = SPECULATIVE_TOKENS,
    tensor_parallel_size: opt.TensorParallelSize = 1,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Print load time, token counts and speeds to stderr.")] = False,
    logprobs: Annotated[int | None, typer.Option(
        min=0, max=20, help="Print each reply token's log-probability and the K most likely "
                            "tokens to stderr.")] = None) -> None:
    """Answer one prompt, streaming the reply to standard output (pipe friendly)."""
    with opt.starting():
        from dataclasses import replace

        from pagedchat.chat.prompt import PLAIN_STOP, has_chat_template, render
        from pagedchat.engine.config import EngineConfig
        from pagedchat.engine.kv_groups import kv_groups
        from pagedchat.engine.llm_engine import LLMEngine
        from pagedchat.engine.opening import open_model
        from pagedchat.engine.sampling_params import SamplingParams

    if prompt is None or prompt == "-":
        if sys.stdin.isatty() and prompt is None:
            raise typer.BadParameter("give a prompt, or pipe one in", param_hint="PROMPT")
        prompt = sys.stdin.buffer.read().removeprefix(b"\xef\xbb\xbf").decode(  # BOM: no text
            "utf-8", errors="surrogateescape")
    if not prompt.strip():
        raise typer.BadParameter("the prompt is empty", param_hint="PROMPT")
    opt.check_text(prompt, "PROMPT")
    opt.check_text(system, "--system")
    try:
        with opt.user_errors("standard output"):
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                    seed=seed, logprobs=logprobs)
            start = time.perf_counter()
            opened = open_model(EngineConfig(model=model, dtype=dtype, weights=weights,
                                             num_kv_blocks=kv_blocks, kv_cache_memory=kv_memory,
                                             kv_cache_dtype=kv_cache_dtype,
                                             swap_space=swap_space("recompute"),
                                             max_num_seqs=RUN.max_num_seqs,
                                             speculative=speculative,
                                             num_speculative_tokens=num_speculative_tokens,
                                             tensor_parallel_size=tensor_parallel_size))
            messages = [{"role": "system", "content": system}] if system and not raw else []
            messages.append({"role": "user", "content": prompt})
            prompt_ids = render(opened.tokenizer, messages, raw)  # raw: the text alone
            if not raw and not has_chat_template(opened.tokenizer):
                # a base model gets plain "User: / Assistant:" lines: it stops at the next
                params = replace(params, stop=[PLAIN_STOP])
            if RUN.pool_per_request and kv_blocks is None and kv_memory is None:
                # the pool serves this one request: sized to what it can need, not to the
                # engine's budget for many; so are the positions (the rotary tables)
                blocks = opened.config.request_kv_blocks(
                    len(prompt_ids), params.max_tokens, params.best_of,
                    kv_groups(opened.model_config).windows)
                positions = min(opened.config.max_model_len, len(prompt_ids) + params.max_tokens)
                opened = replace(opened, config=replace(opened.config, num_kv_blocks=blocks,
                                                        max_model_len=positions))
            engine = LLMEngine(opened)
            loaded = time.perf_counter()
            engine.add_request("run", prompt_ids, params)
            final = None
            while engine.has_unfinished_requests():
                for output in engine.step():
                    sys.stdout.write(output.outputs[0].delta)
                    sys.stdout.flush()
                    final = output
            sys.stdout.write("\n")
            if final is not None and final.error is not None:
                raise RequestError(f"the request failed ({final.error})")
    except KeyboardInterrupt:
        typer.secho("\ninterrupted", err=True)
        raise typer.Exit(130) from None
    if verbose and final is not None:
        _print_run_stats(engine, final, loaded - start)
    if logprobs is not None and final is not None:
        _print_logprobs(engine.tokenizer, final.outputs[0])


def _print_logprobs(tokenizer, output) -> None:
    """One line per reply token: the token, its log-probability and rank, the top K."""
    def show(token_id: int) -> str:
        return repr(tokenizer.decode([token_id]))

    for token, entry in zip(output.token_ids, output.logprobs, strict=True):
        chosen = entry[token]
        others = "  ".join(f"{show(t)} {lp.logprob:.3f}" for t, lp in
                           sorted(entry.items(), key=lambda item: item[1].rank))
        typer.echo(f"{show(token):>16} {chosen.logprob:8.3f}  rank {chosen.rank:<5} {others}",
                   err=True)


def _print_run_stats(engine, final, load_seconds: float) -> None:
    metrics = final.metrics
    out = final.outputs[0]
    ttft = metrics.first_token_time - metrics.arrival_time
    decode = metrics.last_token_time - metrics.first_token_time
    rate = (len(out.token_ids) - 1) / decode if decode > 0 else 0.0
    files = engine.model_files
    source = ("converted weights from the cache" if files.from_cache
              else "GGUF converted now" if files.source.endswith(".gguf") else "HF folder")
    lines = [
        f"load duration:        {load_seconds:.2f}s ({source})",
        f"prompt eval count:    {len(final.prompt_token_ids)} token(s)",
        f"cached prompt tokens: {final.num_cached_tokens}",
        f"kv cache:             {engine.config.num_kv_blocks} blocks of "
        f"{engine.config.block_size} tokens "
        f"({engine.config.num_kv_blocks * engine.runner.block_bytes / 2**20:.1f} MiB, "
        f"{engine.kv_cache_dtype})",
        f"time to first token:  {ttft * 1000:.1f}ms",
        f"eval count:           {len(out.token_ids)} token(s)",
        f"eval rate:            {rate:.2f} tokens/s",
        f"finish reason:        {out.finish_reason}",
        f"speculative decoding: {engine.stats().speculation()}"]
    typer.echo("\n".join(lines), err=True)
