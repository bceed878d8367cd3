"""Gemma 3 270M (the packaged Q4_K_M GGUF, read quantized, its default on the CPU, and
de-quantized): greedy tokens equal transformers ``generate`` on the same weights, with prompts
that cross the 512-token window and a pool small enough to preempt."""

from __future__ import annotations

import pytest

from pagedchat import LLM, SamplingParams
from pagedchat.engine.loading.loader import prepare_model
from tests.engine.models.test_gemma3 import reference
from tests.engine.test_argmax_rows import force_screen

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_model_loads")]

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def gemma_dir():
    return prepare_model("gemma-3-270m").folder


@pytest.fixture(scope="module")
def prompts(gemma_dir) -> list[list[int]]:
    """A short prompt, one just under the window, two well past it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_dir)
    text = ("The history of the printing press begins with movable type in East Asia and "
            "reaches Europe in the fifteenth century, where Gutenberg's workshop in Mainz "
            "combined an oil-based ink, a hand mould for casting type and a screw press. ")
    bos, *ids = tokenizer(text * 40)["input_ids"]
    # different starts: no prompt is a prefix of another, so the pool must be shared out
    return [[bos, *ids[start:start + n]] for start, n in ((0, 12), (5, 500), (9, 530),
                                                          (14, 900))]


@pytest.fixture(scope="module")
def references(gemma_dir, prompts) -> list[list[int]]:
    return reference(gemma_dir, prompts, MAX_TOKENS)


def _generate(prompts, **options) -> tuple[list[list[int]], int]:
    """Each prompt's tokens, and how many preemptions the run took."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model="gemma-3-270m", **options) as llm:
        quantized = llm.engine.runner.model.embed_tokens.quantized is not None
        assert quantized == (options.get("weights", "gguf") == "gguf")
        outs = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        return outs, llm.engine.scheduler.num_preemptions


@pytest.mark.parametrize("weights", ["gguf", "float32"])
def test_greedy_matches_transformers_across_the_window(prompts, references, weights):
    assert _generate(prompts, num_kv_blocks=1024, weights=weights)[0] == references


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_matches_transformers_under_preemption(prompts, references, mode):
    """Enough blocks for any one request, not for all of them at once (a block holds 3
    of the 18 layers: the 3 global layers make one group, the 15 local ones five)."""
    got, preemptions = _generate(prompts, num_kv_blocks=320, preemption_mode=mode,
                                 max_num_batched_tokens=256)
    assert preemptions > 0
    assert got == references


def test_screened_greedy_matches_transformers(prompts, references, monkeypatch):
    """Every batch through the greedy head's 8-bit screen (forced, faster here or not):
    the 262,144-token vocabulary's exact argmax, from a few exact logits per row."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(model="gemma-3-270m", num_kv_blocks=1024) as llm:
        head = llm.engine.runner.model.greedy_head
        screened = force_screen(head, monkeypatch)
        outs = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert len(screened) >= MAX_TOKENS - 1
    assert outs == references
