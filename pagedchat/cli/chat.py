"""`pagedchat chat`: the Textual chat app, its options checked before it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.chat.prompt import DEFAULT_CONTEXT_WINDOW
from pagedchat.cli import options as opt
from pagedchat.engine.presets import PRESETS, SPECULATIVE_TOKENS

CHAT = PRESETS["chat"]


def chat(
    model: opt.Model = None,
    db: Annotated[Path | None, typer.Option(
        help="SQLite file of the sessions (default: chats.db in $PAGEDCHAT_DATA_DIR, "
             "else in $XDG_DATA_HOME/pagedchat).")] = None,
    continue_last: Annotated[bool, typer.Option(
        "--continue", "-c", help="Reopen the last session.")] = False,
    session: Annotated[int | None, typer.Option(help="Reopen the session with this id.")] = None,
    context_window: Annotated[int | None, typer.Option(
        min=16, help="Prompt tokens kept: system prompt plus the newest messages that fit "
                     f"(default: {DEFAULT_CONTEXT_WINDOW}).")] = None,
    kv_blocks: Annotated[int | None, typer.Option(
        min=1, help=f"Blocks in the KV cache pool (default: {CHAT.num_kv_blocks}).")] = None,
    tensor_parallel_size: opt.TensorParallelSize = 1, weights: opt.Weights = None,
    kv_cache_dtype: opt.KvCacheDtype = "auto", speculative: opt.Speculative = None,
    num_speculative_tokens: opt.NumSpeculativeTokens = SPECULATIVE_TOKENS,
    kv_store: Annotated[Path | None, typer.Option(
        help="Folder where the sessions' KV blocks are kept, so that a session reopened "
             "after a restart starts warm (default: kv in $PAGEDCHAT_CACHE_DIR, else in "
             "$XDG_CACHE_HOME/pagedchat).")] = None,
    no_kv_store: Annotated[bool, typer.Option(
        "--no-kv-store", help="Keep no KV blocks on disk.")] = False,
    kv_store_cap: opt.KvStoreCap = "2GiB",
    raw: Annotated[bool, typer.Option(
        "--raw", help="Plain continuation: the model continues your text as it is.")] = False,
    system: Annotated[str | None, typer.Option(help="System prompt of new sessions.")] = None,
    temperature: Annotated[float | None, typer.Option(
        min=0.0, help="Temperature of new sessions (0: greedy).")] = None,
    top_p: Annotated[float | None, typer.Option(help="top_p of new sessions.")] = None,
    top_k: Annotated[int | None, typer.Option(help="top_k of new sessions (0: off).")] = None,
    repetition_penalty: Annotated[float | None, typer.Option(
        help="Repetition penalty of new sessions (1: off).")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        min=1, help="Longest reply of new sessions, in tokens.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of new sessions.")] = None,
    loop_guard: Annotated[bool | None, typer.Option(
        "--loop-guard/--no-loop-guard",
        help="Stop a reply that repeats itself (on by default).")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Defaults file (default: $XDG_CONFIG_HOME/pagedchat/config.toml); these flags "
             "win over it.")] = None) -> None:
    """Chat in the terminal with a model served by the paged engine."""
    from pagedchat.chat.config_file import ConfigError, read_config, settings_of
    from pagedchat.chat.conversation import DEFAULT_SYSTEM_PROMPT, SamplingSettings
    from pagedchat.tui.main import run_chat

    try:
        defaults = read_config(config)
        settings = settings_of({
            "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "repetition_penalty": repetition_penalty, "max_tokens": max_tokens, "seed": seed,
            "loop_guard": loop_guard}, settings_of(defaults, SamplingSettings()))
    except ConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--config") from error
    def chosen(flag, key: str, fallback):
        """The flag, else the config file's value, else the built-in default."""
        return flag if flag is not None else defaults.get(key, fallback)

    if kv_store is not None and no_kv_store:
        raise typer.BadParameter("--kv-store and --no-kv-store do not combine",
                                 param_hint="--no-kv-store")
    if kv_store is not None and tensor_parallel_size > 1:
        raise typer.BadParameter("--kv-store does not combine with --tensor-parallel-size "
                                 f"{tensor_parallel_size}", param_hint="--kv-store")
    store_options = {}
    if not no_kv_store and tensor_parallel_size == 1:
        from pagedchat.paths import cache_root

        store_options = {"kv_store": str(kv_store or cache_root() / "kv"),
                         "kv_store_cap": kv_store_cap}
    run_chat(model=chosen(model, "model", None), db=db, continue_last=continue_last,
             session_id=session, raw=raw, settings=settings,
             context_window=chosen(context_window, "context_window", DEFAULT_CONTEXT_WINDOW),
             system_prompt=chosen(system, "system", DEFAULT_SYSTEM_PROMPT),
             engine_options={"num_kv_blocks": chosen(kv_blocks, "kv_blocks", CHAT.num_kv_blocks),
                             "tensor_parallel_size": tensor_parallel_size, "weights": weights,
                             "kv_cache_dtype": kv_cache_dtype, "speculative": speculative,
                             "num_speculative_tokens": num_speculative_tokens, **store_options})
