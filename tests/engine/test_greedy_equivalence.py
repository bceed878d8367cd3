"""Greedy output of the engine equals transformers ``generate``, one prompt at a time.

Sixteen ShareGPT prompts of mixed length are submitted together under each engine
configuration (block sizes, prefix caching with a shared system prompt, a pool so
small that requests are preempted by recompute and by swap, a token budget so small
that prefills are chunked). The one allowed difference is a true near-tie: at the
first divergence both tokens' log-probabilities are within 1e-4 of each other.
"""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat_lab.sharegpt import sample_requests
from tests.conftest import on_threads
from tests.engine.test_argmax_rows import force_screen

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_model_loads")]

MAX_TOKENS = 32  # decoding runs past two 16-token blocks
NEAR_TIE = 1e-4
SYSTEM = (
    "You are a careful assistant. Answer in plain words, keep answers short, and when a "
    "question is ambiguous say which reading you answer. Never invent facts or sources."
)


@pytest.fixture(scope="module")
def tokenizer(real_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model_dir)


def _chat_ids(tokenizer, messages) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(encoded["input_ids"])


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """16 chat prompts from ShareGPT, lengths spread from a few tokens to ~1000."""
    pool = sample_requests(tokenizer, 400, seed=1, max_prompt_len=990)
    pool.sort(key=lambda r: r.prompt_len)
    picks = [pool[round(i * (len(pool) - 1) / 15)] for i in range(16)]
    picks[-1] = max(pool, key=lambda r: r.prompt_len)
    texts = [tokenizer.decode(r.prompt_ids) for r in picks]
    return [_chat_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def system_prompts(tokenizer, prompts) -> list[list[int]]:
    """Eight shorter prompts that all start with the same system prompt."""
    short = sorted(prompts, key=len)[:8]
    texts = [tokenizer.decode(p) for p in short]
    users = [t.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0] for t in texts]
    return [_chat_ids(tokenizer, [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": u}]) for u in users]


def _reference(hf_model, prompt_sets) -> dict[tuple[int, ...], list[int]]:
    refs = {}
    for ids in prompt_sets:
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS,
                                    do_sample=False, attention_mask=torch.ones(1, len(ids)))
        refs[tuple(ids)] = out[0, len(ids):].tolist()
    return refs


@pytest.fixture(scope="module")
def references(real_hf_model, prompts, system_prompts):
    return _reference(real_hf_model, prompts + system_prompts)


def assert_same_greedy(hf_model, prompts, outputs, references) -> int:
    """Token-identical, or a true near-tie at the first divergence; returns the ties."""
    ties = []
    for ids, output in zip(prompts, outputs):
        ours, ref = output.outputs[0].token_ids, references[tuple(ids)]
        if ours == ref:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        assert at is not None, f"one output is a prefix of the other: {len(ours)} vs {len(ref)}"
        with torch.no_grad():
            logits = hf_model(torch.tensor([ids + ref[:at]])).logits[0, -1]
        logprobs = logits.float().log_softmax(-1)
        gap = abs(logprobs[ours[at]].item() - logprobs[ref[at]].item())
        assert gap < NEAR_TIE, (
            f"prompt of {len(ids)} tokens diverges at output token {at}: ours {ours[at]} vs "
            f"transformers {ref[at]}, log-prob gap {gap:.2e}")
        ties.append((len(ids), at, gap))
    print(f"near-ties: {len(ties)} {ties}")
    assert len(ties) <= 2, f"too many near-ties to be chance: {ties}"
    return len(ties)


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)

CONFIGS = {
    "block16": dict(block_size=16),
    "block1": dict(block_size=1),
    "block64": dict(block_size=64),
    "chunked-prefill": dict(block_size=16, max_num_batched_tokens=40),
}


def blocks_for_all(prompts: list[list[int]], block_size: int) -> int:
    """A pool that holds every prompt and its longest output at once: no preemption."""
    return sum(-(-(len(ids) + MAX_TOKENS) // block_size) for ids in prompts)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_greedy_matches_transformers(name, real_model_dir, real_hf_model, prompts,
                                             references):
    llm = LLM(model=str(real_model_dir), swap_space="64MiB",
              num_kv_blocks=blocks_for_all(prompts, CONFIGS[name]["block_size"]),
              **CONFIGS[name])
    outputs = llm.generate(prompts, GREEDY)
    assert_same_greedy(real_hf_model, prompts, outputs, references)
    stats = llm.engine.stats()
    assert stats.preemptions == 0
    assert stats.used_blocks == 0, "every block must be freed or cached when requests end"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_unchanged_under_preemption(mode, real_model_dir, real_hf_model, prompts,
                                           references):
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    llm = LLM(model=str(real_model_dir), block_size=16, num_kv_blocks=longest // 16 + 12,
              preemption_mode=mode, swap_space="256MiB")
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.engine.stats()
    assert stats.preemptions > 0
    if mode == "swap":
        assert stats.swapped_out > 0 and stats.swapped_in == stats.swapped_out
    assert_same_greedy(real_hf_model, prompts, outputs, references)
    assert stats.used_blocks == 0 and stats.host_blocks_used == 0


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_shared_system_prompt_with_and_without_prefix_cache(
    prefix_caching, real_model_dir, real_hf_model, system_prompts, references
):
    llm = LLM(model=str(real_model_dir), block_size=16,
              num_kv_blocks=blocks_for_all(system_prompts, 16),
              enable_prefix_caching=prefix_caching, swap_space="64MiB")
    first = llm.generate(system_prompts[:1], GREEDY)
    rest = llm.generate(system_prompts[1:], GREEDY)
    stats = llm.engine.stats()
    if prefix_caching:
        assert stats.prefix_hits >= 7 * 16 * (len(_chat_prefix_tokens(system_prompts)) // 16)
        assert all(out.num_cached_tokens > 0 for out in rest)
    else:
        assert stats.prefix_hits == 0
    assert stats.preemptions == 0
    assert_same_greedy(real_hf_model, system_prompts, first + rest, references)


def _chat_prefix_tokens(prompts: list[list[int]]) -> list[int]:
    common = prompts[0]
    for ids in prompts[1:]:
        n = next((i for i, (a, b) in enumerate(zip(common, ids)) if a != b), len(common))
        common = common[:n]
    return common


# Block size 1 is the float configs' and the tiny GGUF's (tests/engine/loading): the
# quantized products see the same rows at any block size.
# (a pool of None holds every request at once)
QUANTIZED = {
    "block16": dict(block_size=16, num_kv_blocks=None),
    "chunked-prefill": dict(block_size=16, num_kv_blocks=None, max_num_batched_tokens=40),
    "preempted": dict(block_size=16, num_kv_blocks=(990 + MAX_TOKENS) // 16 + 12),
}


@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_weights_greedy_matches_transformers(name, real_hf_model, prompts, references):
    """The default GGUF with its tensors kept quantized (``weights="gguf"``) against
    transformers on the same file, which de-quantizes it: the same weights, value for value."""
    options = dict(QUANTIZED[name])
    options["num_kv_blocks"] = options["num_kv_blocks"] or blocks_for_all(prompts, 16)
    llm = LLM(weights="gguf", swap_space="64MiB", **options)
    assert llm.engine.runner.model.quantized
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.engine.stats()
    assert (stats.preemptions > 0) == (name == "preempted")
    assert_same_greedy(real_hf_model, prompts, outputs, references)
    assert stats.used_blocks == 0


def test_greedy_on_two_threads_matches_transformers(real_hf_model, prompts, references):
    """The default GGUF with every product and attention call split between two threads:
    which thread computes which columns and heads changes no token."""
    llm = LLM(weights="gguf", block_size=16, num_kv_blocks=blocks_for_all(prompts, 16),
              max_num_batched_tokens=256)
    with on_threads(2):
        outputs = llm.generate(prompts, GREEDY)
    assert_same_greedy(real_hf_model, prompts, outputs, references)


def test_screened_greedy_matches_transformers(real_hf_model, prompts, references, monkeypatch):
    """Every batch of the default GGUF through the greedy head's 8-bit screen (forced,
    faster here or not) against transformers on the same file."""
    llm = LLM(weights="gguf", block_size=16, num_kv_blocks=blocks_for_all(prompts, 16))
    head = llm.engine.runner.model.greedy_head
    screened = force_screen(head, monkeypatch)
    outputs = llm.generate(prompts, GREEDY)
    assert max(screened) == len(prompts)
    assert_same_greedy(real_hf_model, prompts, outputs, references)
