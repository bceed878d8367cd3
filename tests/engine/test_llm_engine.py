"""Engine behaviour on the tiny random Llama: exactness, streaming, stops, seeds, errors."""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.errors import RequestError

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 200, (n,), generator=gen).tolist()
    return [torch.randint(3, 49000, (length,), generator=gen).tolist() for length in lengths]


def _hf_greedy(hf, ids: list[int], max_new: int) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                      min_new_tokens=max_new, attention_mask=torch.ones(1, len(ids)))
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def hf_references(tiny_hf_model) -> list[list[int]]:
    """transformers' greedy tokens for ``_prompts(6)``, made once for every engine option."""
    return [_hf_greedy(tiny_hf_model, ids, 24) for ids in _prompts(6)]


@pytest.mark.parametrize("options", [
    dict(block_size=16),
    dict(block_size=1),
    dict(block_size=256),
    dict(block_size=8, max_num_batched_tokens=7),
    dict(block_size=4, num_kv_blocks=80, preemption_mode="recompute"),
    dict(block_size=4, num_kv_blocks=80, preemption_mode="swap"),
    dict(block_size=16, enable_prefix_caching=False),
], ids=["bs16", "bs1", "bs256", "budget7", "preempt-recompute", "preempt-swap", "no-prefix"])
def test_tiny_greedy_matches_transformers(options, tiny_model_dir, hf_references):
    """The tiny model's EOS is masked on both sides (ignore_eos / min_new_tokens)."""
    prompts = _prompts(6)
    llm = LLM(model=str(tiny_model_dir), swap_space="16MiB",
              **{"num_kv_blocks": 4096 // options.get("block_size", 16) + 4, **options})
    eos = llm.engine.eos_token_ids
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                   stop_token_ids=[]))
    for ref, out in zip(hf_references, outputs, strict=True):
        ours = out.outputs[0].token_ids
        assert not eos & set(ref), "the reference must not have met EOS"
        assert ours == ref
    stats = llm.engine.stats()
    assert stats.used_blocks == 0
    if "num_kv_blocks" in options:
        assert stats.preemptions > 0


def test_prefix_cache_shares_blocks_of_a_common_prompt(tiny_llm):
    system = list(range(1000, 1040))
    engine = tiny_llm.engine
    engine.add_request("a", system + [5, 6, 7], SamplingParams(temperature=0, max_tokens=30))
    for _ in range(3):
        engine.step()
    engine.add_request("b", system + [8, 9], SamplingParams(temperature=0, max_tokens=30))
    engine.step()
    stats = engine.stats()
    tables = {t.request_id: [b.physical for b in t.blocks] for t in stats.block_tables}
    assert tables["a"][:2] == tables["b"][:2]
    assert stats.shared_blocks >= 2 and stats.prefix_hits >= 32
    for request in ("a", "b"):
        engine.abort_request(request)
    assert engine.stats().used_blocks == 0
    assert not engine.has_unfinished_requests()


def test_a_regenerated_reply_computes_no_prompt_token(tiny_llm):
    """A prompt ending inside a block its earlier reply filled (a regenerate) starts from a
    copy of that block, its last token included, and samples from the hidden state kept
    when that prompt was first computed: every prompt token is cached, the reply the same.
    A reply too short to fill that block leaves it unhashed: only full blocks are found,
    and the last token is computed."""
    prompt = list(range(4000, 4045))  # two blocks of 16, then 13 tokens into the third
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    first = tiny_llm.generate([prompt], params)[0]
    again = tiny_llm.generate([prompt], params)[0]
    assert again.num_cached_tokens == len(prompt)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert tiny_llm.engine.stats().used_blocks == 0

    short = list(range(5000, 5045))
    brief = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    tiny_llm.generate([short], brief)
    assert tiny_llm.generate([short], brief)[0].num_cached_tokens == 32


def test_abort_frees_blocks_at_once(tiny_llm):
    engine = tiny_llm.engine
    engine.add_request("long", list(range(100, 400)), SamplingParams(max_tokens=200))
    engine.step()
    assert engine.stats().used_blocks > 0
    engine.abort_request("long")
    assert engine.stats().used_blocks == 0
    assert engine.step() == []


def test_streamed_deltas_add_up_to_the_text(tiny_llm):
    engine = tiny_llm.engine
    engine.add_request("s", "Hello there", SamplingParams(temperature=0.8, seed=3, max_tokens=40))
    pieces, final = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.append(out.outputs[0].delta)
            final = out
    assert final.finished
    assert "".join(pieces) == final.outputs[0].text
    assert final.outputs[0].text == tiny_llm.tokenizer.decode(
        final.outputs[0].token_ids, skip_special_tokens=True)


def test_seeded_sampling_repeats_whatever_the_batch(tiny_llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=11, max_tokens=20)
    alone = tiny_llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    crowd = tiny_llm.generate(_prompts(4, seed=9) + [[5, 6, 7]],
                              [SamplingParams(temperature=1.0, max_tokens=30)] * 4 + [params])
    assert crowd[-1].outputs[0].token_ids == alone
    other = tiny_llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, seed=12,
                                                          max_tokens=20))[0]
    assert other.outputs[0].token_ids != alone


def test_stop_strings_and_stop_tokens(tiny_llm):
    free = tiny_llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0]
    stop_token = free.token_ids[5]
    stopped = tiny_llm.generate([[1, 2, 3]], SamplingParams(
        temperature=0, max_tokens=24, stop_token_ids=[stop_token]))[0].outputs[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_token) + 1]
    word = free.text[len(free.text) // 2 :][:3]
    if word.strip():
        by_text = tiny_llm.generate([[1, 2, 3]], SamplingParams(
            temperature=0, max_tokens=24, stop=[word]))[0].outputs[0]
        assert by_text.finish_reason == "stop"
        assert by_text.text == free.text[: free.text.index(word)]


def test_max_tokens_gives_length(tiny_llm):
    out = tiny_llm.generate([[1, 2, 3]], GREEDY)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 24


@pytest.mark.parametrize("params, message", [
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=2, best_of=1), "best_of"),
])
def test_impossible_sampling_parameters_are_named(params, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**params)


def test_bad_requests_fail_alone_while_others_go_on(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=20, block_size=16)
    engine = llm.engine
    engine.add_request("good", [1, 2, 3], SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    with pytest.raises(RequestError, match="empty"):
        engine.add_request("empty", "", SamplingParams())
    with pytest.raises(RequestError, match="context"):
        engine.add_request("long", [5] * 1024, SamplingParams())
    with pytest.raises(RequestError, match="whole pool has 20"):
        engine.add_request("huge", [5] * 300, SamplingParams(max_tokens=100))
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request("good", [1], SamplingParams())
    finished = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            finished = out
    assert finished.request_id == "good" and len(finished.outputs[0].token_ids) == 8


def test_stats_count_live_tokens_and_fragmentation(tiny_llm):
    engine = tiny_llm.engine
    engine.add_request("f", list(range(10, 30)), SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    stats = engine.stats()
    assert stats.used_blocks == 2 and stats.live_tokens == 20
    assert stats.empty_slots == 12 and stats.utilization == pytest.approx(20 / 32)
    assert stats.used_blocks + stats.free_blocks + stats.cached_blocks == stats.total_blocks
    table = stats.block_tables[0]
    assert [(b.logical, b.filled, b.ref_count) for b in table.blocks] == [(0, 16, 1), (1, 4, 1)]
    engine.abort_request("f")


def test_parallel_samples_share_the_prompt_blocks(tiny_llm):
    engine = tiny_llm.engine
    engine.add_request("n4", list(range(200, 240)),
                       SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=10))
    engine.step()
    stats = engine.stats()
    group_tables = [t for t in stats.block_tables if t.request_id == "n4"]
    assert len(group_tables) == 4
    prompt_blocks = group_tables[0].blocks[:2]
    assert all(b.ref_count == 4 for b in prompt_blocks)
    assert stats.groups[0].blocks_without_sharing == 12 and stats.groups[0].blocks_held == 3
    outputs = None
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
    texts = [o.token_ids for o in outputs[0].outputs]
    assert len(texts) == 4 and len({tuple(t) for t in texts}) > 1
    assert engine.stats().used_blocks == 0


def test_requests_admitted_in_one_step_share_their_common_prefix(tiny_llm):
    engine = tiny_llm.engine
    system = list(range(3000, 3064))
    for name, tail in (("p", [1, 2]), ("q", [3, 4]), ("r", [5])):
        engine.add_request(name, system + tail, SamplingParams(temperature=0, max_tokens=4))
    engine.step()
    stats = engine.stats()
    tables = {t.request_id: [b.physical for b in t.blocks] for t in stats.block_tables}
    assert tables["p"][:4] == tables["q"][:4] == tables["r"][:4]
    assert all(b.ref_count == 3 for b in stats.block_tables[0].blocks[:4])
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
    assert outputs["q"].num_cached_tokens == 64
    alone = tiny_llm.generate([system + [3, 4]], SamplingParams(temperature=0, max_tokens=4))
    assert alone[0].outputs[0].token_ids == outputs["q"].outputs[0].token_ids
