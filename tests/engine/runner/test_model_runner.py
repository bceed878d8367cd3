"""The model runner's step: logits written into one buffer kept across steps."""

from __future__ import annotations

from pagedchat import LLM, SamplingParams
from tests.engine.test_llm_engine import GREEDY, _prompts


def test_logits_go_to_one_buffer_kept_across_steps(tiny_model_dir):
    """A step's logits are written into rows of a buffer the runner keeps (grown to the next
    power of two of rows), not a new allocation per step; outputs stay the reference's."""
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)
    runner = llm.engine.runner
    seen = []
    buffer = runner._logits_buffer

    def recording(rows):
        logits = buffer(rows)
        seen.append((logits.shape[0], logits.untyped_storage().data_ptr()))
        return logits

    runner._logits_buffer = recording
    prompts = _prompts(5, seed=11)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert {rows for rows, _ in seen} >= {5}
    assert len({pointer for rows, pointer in seen if rows > 4}) == 1
    assert runner._logits.shape[0] == 8
    reference = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16,
                    attention_backend="torch")
    assert ours == [o.outputs[0].token_ids for o in reference.generate(prompts, GREEDY)]


def test_the_kernels_get_the_steps_largest_query_and_context(tiny_model_dir, monkeypatch):
    """AttentionMetadata's host-side maxima reach the attention kernel (the Triton backend
    sizes its launch by them instead of reading the lengths back from the device)."""
    from pagedchat.kernels import reference

    seen = []
    attention = reference.paged_attention

    def recording(*args, **hints):
        seen.append((hints["max_query_len"], hints["max_context_len"]))
        return attention(*args, **hints)

    monkeypatch.setattr(reference, "paged_attention", recording)
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, attention_backend="torch")
    prompts = _prompts(2, seed=3)
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    longest = max(map(len, prompts))
    layers = llm.engine.model_config.num_hidden_layers
    assert seen == [(longest, longest)] * layers + [(1, longest + 1)] * layers
