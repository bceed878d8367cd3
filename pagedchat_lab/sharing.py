"""Memory saved by sharing KV blocks within a request (the paper's Fig. 15).

For every step the engine reports, per running group with several sequences, the blocks
its sequences would hold without sharing (the sum of their block-table lengths) and the
distinct blocks they hold. The saving of a step is ``1 - held / without`` over all such
groups; a run's figure is the mean over the steps that had any. Parallel sampling
(``n`` samples at temperature 1) and beam search (width ``k``) run on ShareGPT first turns
and on short Alpaca-like ones. Outputs follow the trace's lengths (EOS is ignored), as in
the paper, so every sample and beam lives as long as its request's reference answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab import sharegpt
from pagedchat_lab.sharegpt import Request
from pagedchat_lab.suite import length_limit

# the paper's range over widths 2..6 (OPT-13B), percent
PAPER = {("sharegpt", "parallel"): "16.2-30.5", ("alpaca", "parallel"): "6.1-9.8",
         ("sharegpt", "beam"): "44.3-66.3", ("alpaca", "beam"): "37.6-55.2"}
COLUMNS = ["workload", "method", "width", "memory_saved_pct", "paper_pct", "requests",
           "steps", "mean_seqs"]


def sharing_params(method: str, width: int, request: Request, seed: int) -> SamplingParams:
    if method == "parallel":
        return SamplingParams(n=width, temperature=1.0, seed=seed, max_tokens=request.output_len,
                              ignore_eos=True)
    return SamplingParams(n=1, best_of=width, use_beam_search=True, temperature=0.0,
                          max_tokens=request.output_len, ignore_eos=True)


def run_saving(engine: LLMEngine, requests: list[Request], method: str, width: int
               ) -> dict[str, float]:
    """Run ``requests`` all at once; the mean per-step memory saving, in percent."""
    for i, request in enumerate(requests):
        engine.add_request(f"{method}-{width}-{i}", request.prompt_ids,
                           sharing_params(method, width, request, seed=i))
    savings, seqs = [], []
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        groups = engine.stats().groups
        without = sum(g.blocks_without_sharing for g in groups)
        if without:
            savings.append(1 - sum(g.blocks_held for g in groups) / without)
            seqs.append(sum(g.num_seqs for g in groups))
    return {"memory_saved_pct": 100 * sum(savings) / max(len(savings), 1), "steps": steps,
            "mean_seqs": sum(seqs) / max(len(seqs), 1)}


def measure_sharing(engine: LLMEngine, num_requests: int = 24, max_tokens: int | None = 128,
                    seed: int = 0, widths: Sequence[int] = (2, 4, 6)) -> list[dict[str, object]]:
    """One row per workload x method x width, the paper's range beside ours.

    The engine is reused run after run (it is idle and its pool balanced in between)."""
    cfg = engine.config
    # each request must fit the pool unshared (as a group preempted by recompute resumes)
    limit = min(length_limit(engine), cfg.num_kv_blocks // max(widths) * cfg.block_size)
    workloads = {
        "sharegpt": sharegpt.sample_requests(engine.tokenizer, num_requests, seed, max_tokens,
                                             max_total_len=limit),
        "alpaca": sharegpt.sample_alpaca_like(engine.tokenizer, num_requests, seed, max_tokens),
    }
    rows: list[dict[str, object]] = []
    for workload, requests in workloads.items():
        for method in ("parallel", "beam"):
            for width in widths:
                figures = run_saving(engine, requests, method, width)
                rows.append({"workload": workload, "method": method, "width": width,
                             **figures, "paper_pct": PAPER[workload, method],
                             "requests": len(requests)})
    return rows
