"""What an int8 KV cache (``--kv-cache-dtype int8``) gives and costs, against the same
engine with K/V in its dtype: greedy agreement and perplexity, KV bytes per token, decode
speed at a long context, and how many sequences a fixed pool runs before it preempts."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

import torch

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import Scheduler
from pagedchat.engine.sequence import SequenceGroup
from pagedchat_lab.quality import _forcing, reply_logprobs, shared_prefix_len


def _batch(engine: LLMEngine, prompts: list[list[int]],
           params: list[SamplingParams]) -> list:
    """Every prompt's completion, all in one continuous batch, in prompt order."""
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"kv-{i}", ids, p)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    return [done[f"kv-{i}"] for i in range(len(prompts))]


def agreement(quantized: LLMEngine, plain: LLMEngine, prompts: list[list[int]],
              max_tokens: int) -> dict[str, float]:
    """The plain engine's greedy tokens, forced through the quantized one: the share of
    them that are its own greedy choice too (each position on the same history, so one
    difference does not count again in every token after it); and both run free: how many
    leading tokens they share and how many replies are the same throughout."""
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    reference = [c.token_ids for c in _batch(plain, prompts, [greedy] * len(prompts))]
    forced = _batch(quantized, prompts, [
        replace(greedy, logprobs=0, logits_processors=[_forcing(tokens)])
        for tokens in reference])
    ranks = [entry[token].rank for c in forced
             for token, entry in zip(c.token_ids, c.logprobs, strict=True)]
    free = [c.token_ids for c in _batch(quantized, prompts, [greedy] * len(prompts))]
    shared = [shared_prefix_len(a, b) for a, b in zip(free, reference, strict=True)]
    return {"prompts": len(prompts), "tokens": len(ranks),
            "token_agreement": sum(rank == 1 for rank in ranks) / len(ranks),
            "mean_shared_prefix_tokens": sum(shared) / len(shared),
            "identical_replies": sum(a == b for a, b in zip(free, reference, strict=True))
            / len(prompts)}


def perplexity(quantized: LLMEngine, plain: LLMEngine,
               pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """Perplexity of held-out replies given their prompts under each engine."""
    tokens = sum(len(reply) for _, reply in pairs)
    return {"replies": len(pairs), "reply_tokens": tokens,
            "perplexity": math.exp(-sum(reply_logprobs(quantized, pairs)) / tokens),
            "plain_kv_perplexity": math.exp(-sum(reply_logprobs(plain, pairs)) / tokens)}


def bytes_per_token(engine: LLMEngine) -> float:
    """KV bytes one token of context holds in the pool (every layer's K and V)."""
    runner = engine.runner
    return runner.block_bytes * runner.kv_groups.num_groups / engine.config.block_size


def decode_seconds(engines: list[LLMEngine], context: int, rounds: int,
                   steps: int) -> list[float]:
    """Each engine's median seconds per decode step of one sequence whose context is
    ``context`` tokens (then a few more as it decodes), the engines taking turns, ``steps``
    steps a turn, so that a change in the machine's load falls on both."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, 10_000, (context,), generator=generator).tolist()
    params = SamplingParams(temperature=0, max_tokens=rounds * steps + 2, ignore_eos=True)
    for engine in engines:
        engine.add_request("long", prompt, params)
        while not any(out.outputs[0].token_ids for out in engine.step()):
            pass  # the prompt's chunks, until its first token
    times: list[list[float]] = [[] for _ in engines]
    for _ in range(rounds):
        for engine, spent in zip(engines, times, strict=True):
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            spent.append((time.perf_counter() - start) / steps)
    for engine in engines:
        engine.abort_request("long")
    return [statistics.median(spent) for spent in times]


def running_before_preemption(engine: LLMEngine, prompt_len: int, max_tokens: int,
                              requests: int) -> int:
    """The most sequences running at once before the first preemption, ``requests`` of
    ``prompt_len`` distinct tokens each decoding ``max_tokens``, in the engine's own pool
    (its block count), through a scheduler and block manager like the engine's with no
    forward pass: which blocks are held does not depend on the values."""
    bm = engine.scheduler.block_manager
    config = engine.config
    scheduler = Scheduler(config, BlockManager(config.num_kv_blocks, bm.block_size, 0,
                                               bm.enable_prefix_caching, bm.windows))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(requests):
        prompt = [10 + (i * prompt_len + t) % 40_000 for t in range(prompt_len)]
        scheduler.add(SequenceGroup(f"r{i}", None, prompt, params))
    most = 0
    while scheduler.num_preemptions == 0:
        out = scheduler.schedule()
        if not out.scheduled:
            break
        most = max(most, len({item.seq.seq_id for item in out.scheduled}))
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            if item.samples:
                item.seq.append_token(0, 0.0)
    return most
