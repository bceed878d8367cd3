"""Qwen2.5-Coder-0.5B-Instruct (the named model ``qwen2.5-coder-0.5b``, its Q4_K_M GGUF
read quantized): greedy tokens equal transformers ``generate`` on the same GGUF, alone,
from the prefix cache, and under preemption. Skipped where its packages are not installed
(they are no test dependency: the file is 469 MiB)."""

from __future__ import annotations

import pytest

from pagedchat import LLM, SamplingParams
from pagedchat.engine.loading.loader import prepare_model
from pagedchat.engine.loading.named_models import NAMED_MODELS, is_installed, named_model_path
from tests.engine.models.test_gemma3 import reference

NAME = "qwen2.5-coder-0.5b"
MAX_TOKENS = 16
SYSTEM = ("You are a careful programming assistant. Answer with short, correct Python code "
          "and one sentence of explanation; prefer the standard library.")
QUESTIONS = ("Write a Python function that reverses a string.",
             "How do I read a JSON file in Python?")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("shared_model_loads"),
    pytest.mark.skipif(not is_installed(NAMED_MODELS[NAME]), reason=(
        f"{NAME} is not installed: {NAMED_MODELS[NAME].install_command()}")),
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Two chat prompts that share their system prompt (two whole blocks and more)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare_model(NAME, "gguf").folder)
    return [list(tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        tokenize=True, add_generation_prompt=True)["input_ids"]) for question in QUESTIONS]


@pytest.fixture(scope="module")
def references(prompts) -> list[list[int]]:
    path = named_model_path(NAME)
    return reference(path.parent, prompts, MAX_TOKENS, gguf_file=path.name)


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_greedy_matches_transformers_and_again_from_the_prefix_cache(prompts, references):
    with LLM(model=NAME, num_kv_blocks=64) as llm:
        first = llm.generate(prompts, GREEDY)
        again = llm.generate(prompts, GREEDY)
    assert [out.outputs[0].token_ids for out in first] == references
    assert [out.outputs[0].token_ids for out in again] == references
    assert all(out.num_cached_tokens >= 32 for out in again)


def test_greedy_matches_transformers_under_preemption(prompts, references):
    """A pool that holds both prompts but not both answers: one request is preempted and
    recomputed."""
    blocks = sum(-(-len(ids) // 16) for ids in prompts)
    assert blocks < sum(-(-(len(ids) + MAX_TOKENS) // 16) for ids in prompts)
    with LLM(model=NAME, num_kv_blocks=blocks, enable_prefix_caching=False) as llm:
        got = [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY)]
        preemptions = llm.engine.scheduler.num_preemptions
    assert preemptions > 0
    assert got == references
