"""KV bytes per token by context: the scheduler-only count equals the engine's own, and both
follow the window's formula; a model without windows keeps every layer."""

from __future__ import annotations

import pytest

from pagedchat import LLM
from pagedchat_lab.context_memory import measure
from tests.engine.models.test_gemma3 import WINDOW, save_tiny_gemma3

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def gemma_llm(tmp_path_factory, tiny_tokenizer):
    folder = save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3-memory"), tiny_tokenizer)
    with LLM(model=str(folder), block_size=BLOCK_SIZE, num_kv_blocks=256,
             max_num_batched_tokens=32) as llm:
        yield llm


@pytest.mark.parametrize("context", [10, 45, 120])
def test_scheduler_count_equals_the_engine_running_the_model(gemma_llm, context):
    engine = gemma_llm.engine
    dry = measure(engine, context, run_model=False)
    real = measure(engine, context, run_model=True)
    assert (dry.global_blocks, dry.local_blocks) == (real.global_blocks, real.local_blocks)
    assert engine.stats().used_blocks == 0
    # the step at position ``context`` holds every block up to it in the global group and,
    # in each of the three local groups, those from its window's first block
    blocks = -(-(context + 1) // BLOCK_SIZE)
    first = max(context - WINDOW + 1, 0) // BLOCK_SIZE
    assert dry.global_blocks == blocks
    assert dry.local_blocks == 3 * (blocks - first)
    assert dry.ratio == pytest.approx((dry.global_blocks + dry.local_blocks) * BLOCK_SIZE
                                      / (4 * context))


def test_without_windows_every_layer_is_kept(tiny_llm):
    row = measure(tiny_llm.engine, 64, run_model=False)
    assert row.local_blocks == 0
    assert row.ratio == pytest.approx((64 + 16) / 64)  # 65 tokens fill 5 blocks of 16
