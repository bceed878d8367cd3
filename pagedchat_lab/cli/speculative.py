"""`pagedchat bench speculative`: single-stream tokens/s with and without n-gram speculation,
on code edits and on ShareGPT chats."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import NumSpeculativeTokens, user_errors
from pagedchat.engine.presets import SPECULATIVE_TOKENS
from pagedchat_lab.cli import options as opt

WORKLOADS = ("code", "sharegpt")


def _check_workloads(value: str) -> str:
    from pagedchat_lab.suite import parse_list

    unknown = [name for name in parse_list(value) if name not in WORKLOADS]
    if unknown or not parse_list(value):
        raise typer.BadParameter(f"choose from {', '.join(WORKLOADS)}")
    return value


def speculative(model: opt.Model = None, num_prompts: Annotated[int, typer.Option(
                    "-n", "--num-prompts", min=1, help="Prompts per workload.")] = 20,
                max_tokens: Annotated[int, typer.Option(
                    "--max-tokens", min=2, help="Longest answer, in tokens.")] = 256,
                workloads: Annotated[str, typer.Option(
                    "--workload", callback=_check_workloads,
                    help="code (edits of standard library functions), sharegpt, or both.")]
                = "code,sharegpt",
                num_speculative_tokens: NumSpeculativeTokens = SPECULATIVE_TOKENS,
                rounds: Annotated[int, typer.Option(
                    "--rounds", min=1, help="Times every prompt is answered by each.")] = 1,
                seed: opt.Seed = 0, dtype: opt.DTypeOption = opt.DType.float32,
                weights: opt.Weights = None, json_path: opt.JsonPath = None) -> None:
    """Single stream, greedy: tokens/s without and with n-gram speculative decoding (the
    two engines in turn, prompt by prompt), their ratio, the share of proposed tokens
    accepted and whether the tokens were the same."""
    from pagedchat_lab import report
    from pagedchat_lab.speculative import code_prompts, compare, sharegpt_prompts
    from pagedchat_lab.suite import parse_list

    with user_errors():
        options = opt.engine_options(model, dtype, weights=weights).with_(max_num_seqs=1)
        plain = options.build()
        fast = options.with_(speculative="ngram",
                             num_speculative_tokens=num_speculative_tokens).build()
        figures: dict[str, dict[str, object]] = {}
        for workload in parse_list(workloads):
            prompts = (code_prompts(plain.tokenizer, num_prompts) if workload == "code"
                       else sharegpt_prompts(plain.tokenizer, num_prompts, seed))
            with console.progress(f"{workload}: {len(prompts)} prompts", 1):
                figures[workload] = compare(plain, fast, prompts, max_tokens, rounds)
        report.emit_table("speculative", [{"workload": w, **f} for w, f in figures.items()],
                          ["workload", "plain_decode_tokens_per_s",
                           "speculative_decode_tokens_per_s", "decode_ratio",
                           "end_to_end_ratio", "acceptance_rate", "greedy_identical"])
        console.note(f"greedy, one request at a time, up to {max_tokens} tokens each; decode: "
                     "tokens after the first over the time from the first to the last; "
                     f"ngram speculation with up to {num_speculative_tokens} proposed tokens")
        report.save(json_path, fast, figures)
