"""Parallel sampling (n, best_of): one prefill, forks that share the prompt's blocks,
copy-on-write only where a sample writes into a shared block, seeded samples that repeat."""

from __future__ import annotations

import pytest

from pagedchat import LLM, SamplingParams
from pagedchat.engine.errors import RequestError

PROMPT = list(range(500, 540))  # 40 tokens: two full blocks of 16 and a partial one


@pytest.fixture
def llm(tiny_model_dir) -> LLM:
    return LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)


def _run(llm: LLM, params: SamplingParams, prompt: list[int] = PROMPT):
    return llm.generate([prompt], params)[0]


def test_n4_prefills_once_and_shares_the_prompt_until_written(llm, monkeypatch):
    engine = llm.engine
    steps = []
    execute = engine.runner.execute

    def spy(step):
        steps.append((len(step.input_ids), list(step.copies)))
        return execute(step)

    monkeypatch.setattr(engine.runner, "execute", spy)
    engine.add_request("n4", PROMPT, SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=8))
    engine.step()
    group = engine.scheduler.find("n4")
    assert steps == [(40, [])]  # the prompt once, nothing copied
    assert len(group.seqs) == 4
    tables = [list(seq.block_table) for seq in group.seqs]
    assert all(table == tables[0] for table in tables)
    assert [engine.scheduler.block_manager.blocks[b].ref_count for b in tables[0]] == [4, 4, 4]
    sharing = engine.stats().groups[0]
    assert (sharing.blocks_without_sharing, sharing.blocks_held) == (12, 3)

    engine.step()
    tokens, copies = steps[1]
    assert tokens == 4  # one new token per sample, no second prefill
    # the shared, partly filled last block is copied for three samples, in one batch;
    # the fourth writes into it in place
    assert len(copies) == 3 and {src for src, _ in copies} == {tables[0][2]}
    assert [engine.scheduler.block_manager.blocks[b].ref_count for b in tables[0][:2]] == [4, 4]
    assert len({seq.block_table[2] for seq in group.seqs}) == 4
    sharing = engine.stats().groups[0]
    assert (sharing.blocks_without_sharing, sharing.blocks_held) == (12, 6)
    while engine.has_unfinished_requests():
        engine.step()
    assert all(not c for _, c in steps[2:])  # later tokens go to private blocks
    assert engine.stats().used_blocks == 0


def test_seeded_samples_repeat_exactly_and_differ_from_each_other(llm, tiny_llm):
    params = SamplingParams(n=4, temperature=0.9, top_p=0.95, seed=21, max_tokens=24)
    first = [o.token_ids for o in _run(llm, params).outputs]
    again = [o.token_ids for o in _run(llm, params).outputs]
    crowd = tiny_llm.generate([list(range(9, 90)), PROMPT, [3, 4]],
                              [SamplingParams(n=2, temperature=1.0, max_tokens=30), params,
                               SamplingParams(temperature=1.0, max_tokens=12)])[1]
    assert first == again == [o.token_ids for o in crowd.outputs]
    assert len({tuple(t) for t in first}) == 4
    other = [o.token_ids for o in _run(llm, SamplingParams(
        n=4, temperature=0.9, top_p=0.95, seed=22, max_tokens=24)).outputs]
    assert other != first


def test_best_of_returns_the_n_most_likely_samples(llm):
    out = _run(llm, SamplingParams(n=2, best_of=5, temperature=1.0, seed=3, max_tokens=12))
    assert len(out.outputs) == 2
    every = _run(llm, SamplingParams(n=5, temperature=1.0, seed=3, max_tokens=12))
    ranked = sorted(every.outputs, key=lambda o: -o.cumulative_logprob)[:2]
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in ranked]


def test_groups_that_could_never_run_are_refused_at_once(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=24, block_size=16, max_num_seqs=4)
    with pytest.raises(RequestError, match="max_num_seqs=4"):
        llm.engine.add_request("wide", PROMPT, SamplingParams(n=5, temperature=1.0))
    # 6 samples of 40 + 40 tokens fit shared (2 + 6 * 3 = 20 blocks) but not unshared
    # (6 * 5 = 30), which a preempted group resumed by recompute needs
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=24, block_size=16)
    with pytest.raises(RequestError, match="whole pool has 24"):
        llm.engine.add_request("long", PROMPT, SamplingParams(n=6, max_tokens=40))
