"""A reply regenerated on a long conversation: the prompt tokens it computes again and its
first token against a decode step of the reply it replaces, and against the same prompt
computed from an empty cache."""

from __future__ import annotations

import statistics

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab.warm_start import first_token


def regenerate(engine: LLMEngine, conversation: list[int], reply_tokens: int,
               rounds: int) -> dict[str, object]:
    """Each round answers ``conversation`` from an empty cache (cold), then regenerates
    that answer with another seed, as the chat app's regenerate does (warm)."""
    cold, warm, steps, recomputed = [], [], [], []
    for n in range(rounds):
        engine.reset_prefix_cache()
        first = SamplingParams(temperature=0.8, seed=2 * n, max_tokens=reply_tokens,
                               ignore_eos=True)
        spent, output = first_token(engine, conversation, f"reply-{n}", first)
        cold.append(spent)
        times = output.metrics.token_times
        steps.append(statistics.median(b - a for a, b in zip(times, times[1:])))
        again = SamplingParams(temperature=0.8, seed=2 * n + 1, max_tokens=2, ignore_eos=True)
        spent, output = first_token(engine, conversation, f"again-{n}", again)
        warm.append(spent)
        recomputed.append(len(conversation) - output.num_cached_tokens)
    return {"prompt_tokens": len(conversation), "recomputed_tokens": max(recomputed),
            "regenerate_ttft_s": statistics.median(warm),
            "decode_step_s": statistics.median(steps),
            "ttft_over_step": statistics.median(w / s for w, s in zip(warm, steps,
                                                                       strict=True)),
            "cold_ttft_s": statistics.median(cold)}
