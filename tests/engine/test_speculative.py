"""Speculative decoding (``speculative="ngram"``): drafted tokens verified in one step.

The tiny random model never repeats itself, so n-gram drafts would never be accepted on
it. The engine tests here swap the n-gram proposer for an oracle that proposes the
reference continuation (transformers' greedy tokens) with every third draft's last token
made wrong: drafts are then both accepted and rejected, across block boundaries, and each
test asserts that some were accepted and some rejected, so none passes without verifying.
The n-gram proposer is tested on its own, and on the real model in test_speculative_real.
"""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.errors import RequestError
from pagedchat.engine.ngram_proposer import NgramProposer
from pagedchat.engine.sampling.rejection import accept_draft
from pagedchat.engine.sequence import Sequence
from pagedchat.engine.step_costs import EXPIRY, MIN_SAMPLES, StepCosts

MAX_TOKENS = 24


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 120, (n,), generator=gen).tolist()
    return [torch.randint(3, 49000, (length,), generator=gen).tolist() for length in lengths]


def _hf_greedy(hf, ids: list[int], max_new: int) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                      min_new_tokens=max_new, attention_mask=torch.ones(1, len(ids)))
    return out[0, len(ids):].tolist()


class Oracle:
    """Proposes the reference continuation of a sequence's prompt; every third draft has
    its last token changed, so that its verification rejects it."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = references
        self.calls = 0

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        pass

    def timed(self, rows: int, seconds: float) -> None:
        pass

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        reference = self.references[tuple(seq.token_ids[: seq.num_prompt_tokens])]
        done = seq.num_output_tokens
        if seq.output_token_ids != reference[:done]:
            return []  # a sampled sequence left the reference: nothing to propose
        draft = reference[done : done + limit]
        self.calls += 1
        if draft and self.calls % 3 == 0:
            draft[-1] = (draft[-1] + 1) % 49000
        return draft


@pytest.fixture(scope="module")
def references(tiny_hf_model) -> dict[tuple[int, ...], list[int]]:
    prompts = _prompts(6)
    shared = list(range(1000, 1040))  # two prompts share 40 tokens: prefix-cache hits
    prompts += [shared + [7, 8, 9], shared + [10, 11]]
    return {tuple(ids): _hf_greedy(tiny_hf_model, ids, MAX_TOKENS) for ids in prompts}


def _speculative_llm(model_dir, references, **options) -> LLM:
    llm = LLM(model=str(model_dir), swap_space="16MiB", speculative="ngram",
              num_speculative_tokens=options.pop("k", 4), **options)
    llm.engine.scheduler.proposer = Oracle(references)
    return llm


def _pool_balances(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert stats.used_blocks == 0
    assert stats.free_blocks + stats.cached_blocks == stats.total_blocks


@pytest.mark.parametrize("options", [
    dict(block_size=16, num_kv_blocks=300),
    dict(block_size=1, num_kv_blocks=4200),
    dict(block_size=4, num_kv_blocks=1100, k=7),
    dict(block_size=8, num_kv_blocks=600, max_num_batched_tokens=9),
    dict(block_size=4, num_kv_blocks=70, preemption_mode="recompute"),
    dict(block_size=4, num_kv_blocks=70, preemption_mode="swap"),
    dict(block_size=16, num_kv_blocks=300, enable_prefix_caching=False),
    dict(block_size=8, num_kv_blocks=600, attention_backend="torch"),
], ids=["bs16", "bs1", "bs4-k7", "budget9", "preempt-recompute", "preempt-swap", "no-prefix",
        "torch-kernels"])
def test_greedy_with_drafts_matches_transformers(options, tiny_model_dir, references):
    llm = _speculative_llm(tiny_model_dir, references, **options)
    prompts = [list(p) for p in references]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                   ignore_eos=True))
    for ids, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == references[tuple(ids)]
    stats = llm.engine.stats()
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert stats.speculative == "ngram"
    if options.get("num_kv_blocks") == 70:
        assert stats.preemptions > 0
    if options.get("enable_prefix_caching", True):
        assert stats.prefix_hits > 0
    _pool_balances(llm)


def test_drafts_of_parallel_samples_copy_shared_blocks_and_stay_exact(tiny_model_dir,
                                                                      references):
    """n = 3 greedy samples share the prompt's blocks; each drafts into its own."""
    llm = _speculative_llm(tiny_model_dir, references, block_size=4, num_kv_blocks=400)
    prompt = list(next(iter(references)))
    [out] = llm.generate([prompt], SamplingParams(n=3, temperature=0, max_tokens=MAX_TOKENS,
                                                  ignore_eos=True))
    assert [o.token_ids for o in out.outputs] == [references[tuple(prompt)]] * 3
    stats = llm.engine.stats()
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    _pool_balances(llm)


def test_every_sampling_path_gives_the_plain_engines_tokens(tiny_model_dir, tiny_llm,
                                                            references):
    """Greedy with logprobs and a repetition penalty (the whole logits, row by row), and
    temperature 1 with top_k=1 (the acceptance test with a certain target): the tokens and
    log-probabilities of the engine without drafts."""
    prompts = [list(p) for p in references][:4]
    plain = tiny_llm
    fast = _speculative_llm(tiny_model_dir, references, num_kv_blocks=300)
    for params in (SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                  logprobs=2),
                   SamplingParams(temperature=1.0, top_k=1, max_tokens=MAX_TOKENS, seed=3,
                                  ignore_eos=True)):
        want = plain.generate(prompts, params, use_progress=False)
        got = fast.generate(prompts, params, use_progress=False)
        for a, b in zip(want, got, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            assert b.outputs[0].cumulative_logprob == pytest.approx(
                a.outputs[0].cumulative_logprob, abs=1e-3)
            if params.logprobs is not None:
                assert [sorted(e) for e in a.outputs[0].logprobs] == [
                    sorted(e) for e in b.outputs[0].logprobs]
    stats = fast.engine.stats()
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    _pool_balances(fast)


def test_stops_inside_an_accepted_run_cut_it_there(tiny_model_dir, tiny_llm, references):
    """A stop token, a stop string and max_tokens met inside a draft end the sequence as a
    plain decode does: same tokens, text and finish reason."""
    prompt = list(next(iter(references)))
    reference = references[tuple(prompt)]
    plain = tiny_llm
    fast = _speculative_llm(tiny_model_dir, references, num_kv_blocks=200)
    text = plain.tokenizer.decode(reference[:10])
    cases = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[reference[6]]),
             SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            stop=[text[-3:]]),
             SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)]
    for params in cases:
        [want] = plain.generate([prompt], params, use_progress=False)
        [got] = fast.generate([prompt], params, use_progress=False)
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].text == want.outputs[0].text
        assert got.outputs[0].finish_reason == want.outputs[0].finish_reason
        assert len(got.metrics.token_times) == len(got.outputs[0].token_ids)
    assert fast.engine.stats().accepted_tokens > 0
    _pool_balances(fast)


def test_beam_search_is_refused_with_speculation(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, speculative="ngram")
    with pytest.raises(RequestError, match="beam search.*speculative") as caught:
        llm.engine.add_request("b", [5, 6, 7], SamplingParams(
            n=2, use_beam_search=True, temperature=0, max_tokens=4))
    assert caught.value.param == "use_beam_search"


@pytest.mark.parametrize("options, message", [
    (dict(speculative="eagle"), "speculative must be"),
    (dict(speculative="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(speculative="ngram", ngram_min=3, ngram_max=2), "ngram_min"),
])
def test_bad_speculation_options_are_refused(options, message):
    from pagedchat.engine.config import EngineConfig

    with pytest.raises(RequestError, match=message):
        EngineConfig(**options)


# ---- the n-gram proposer ---------------------------------------------------------------
def _brute_force(tokens: list[int], low: int, high: int, limit: int) -> list[int]:
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        suffix = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                draft = tokens[end : end + limit]
                while len(draft) < limit:  # a repeating run goes on repeating
                    draft.append(draft[len(draft) - (len(tokens) - end)])
                return draft
    return []


def test_proposer_takes_the_longest_latest_match():
    proposer = NgramProposer(1, 3, row_cost=0)
    seq = Sequence([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3], 13)
    # "2 3" ends the sequence; "1 2 3" does not: the latest "2 3" is followed by 7 8 5
    assert proposer.propose(seq, 2) == [7, 8]
    seq.token_ids += [7]  # now "2 3 7" matches at its one earlier place
    assert proposer.propose(seq, 4) == [8, 5, 2, 3]
    seq.token_ids += [8, 5, 2, 3, 7]  # "3 7" last seen 5 tokens back: the run repeats
    assert proposer.propose(seq, 7) == [8, 5, 2, 3, 7, 8, 5]
    assert proposer.propose(Sequence([4, 5, 6], 3), 4) == []
    assert proposer.propose(seq, 0) == []


def test_proposer_index_grows_with_the_sequence_as_a_search_would_find():
    gen = torch.Generator().manual_seed(1)
    proposer = NgramProposer(2, 4, row_cost=0)
    seq = Sequence(torch.randint(0, 4, (5,), generator=gen).tolist(), 5)
    hits = 0
    for _ in range(150):
        want = _brute_force(seq.token_ids, 2, 4, 3)
        assert proposer.propose(seq, 3) == want
        hits += bool(want)
        seq.token_ids += torch.randint(0, 4, (int(torch.randint(1, 3, ())),),
                                       generator=gen).tolist()
    assert hits > 100


def test_draft_length_follows_how_drafts_fare():
    """Drafts grow while they are accepted, stop after rejections, and come back once the
    sequence has gone without drafts for a while."""
    proposer = NgramProposer(1, 1, row_cost=0.3)
    seq = Sequence([5] * 40, 40)  # every suffix matches: the length is the policy's alone
    lengths = []
    for _ in range(6):
        draft = proposer.propose(seq, 8)
        lengths.append(len(draft))
        proposer.record(seq, len(draft), len(draft))
    assert lengths[0] >= 1 and lengths[-1] > lengths[0]
    rejected = 0
    while draft := proposer.propose(seq, 8):
        proposer.record(seq, len(draft), 0)
        rejected += 1
        assert rejected < 20
    idle = 1
    while not proposer.propose(seq, 8):
        idle += 1
    assert idle < 20



def test_drafts_are_sized_by_how_drafts_after_matches_of_that_length_fared():
    """Drafts behind long matches that were accepted grow long; drafts behind one-token
    matches that were rejected become rare (tried again now and then); each match length
    keeps its own estimate."""
    proposer = NgramProposer(1, 4, row_cost=0.3)
    quoting = Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], 13)  # "1 2 3 4" recurs
    chance = Sequence([20, 21, 22, 23, 21], 5)  # only "21" recurs
    chance_drafts = 0
    for _ in range(12):
        draft = proposer.propose(quoting, 4)
        proposer.record(quoting, len(draft), len(draft))
        draft = proposer.propose(chance, 4)
        proposer.record(chance, len(draft), 0)
        chance_drafts += bool(draft)
    assert proposer.propose(quoting, 4) == [5, 6, 7, 8]
    assert 1 <= chance_drafts <= 5


def test_step_costs_take_timed_steps_over_the_prior():
    costs = StepCosts(row_cost=0.5)
    assert costs.relative(3) == pytest.approx(2.0)  # nothing timed: the prior
    for seconds in (0.010, 0.011, 0.009):  # 2 rows timed: 1 row and 3 from the prior
        costs.record(2, seconds)
    assert costs.relative(2) == pytest.approx(1.5)
    assert costs.relative(4) == pytest.approx(2.5 / 1.5 * 1.5)
    for seconds in (0.008, 0.008, 0.008):
        costs.record(1, seconds)
    assert costs.relative(2) == pytest.approx(0.010 / 0.008)
    assert costs.relative(3) == pytest.approx(0.010 * 2.0 / 1.5 / 0.008)
    for seconds in (0.05, 0.05):  # fewer than MIN_SAMPLES: not yet taken
        costs.record(3, seconds)
    assert costs.relative(3) == pytest.approx(0.010 * 2.0 / 1.5 / 0.008)
    costs.record(3, 0.05)
    assert costs.relative(3) == pytest.approx(0.05 / 0.008)
    for _ in range(EXPIRY):
        costs.record(1, 0.008)
    assert costs.relative(3) == pytest.approx(0.05 / 0.008)
    costs.record(1, 0.008)  # 2 and 3 rows not timed for EXPIRY steps: the prior again
    assert costs.relative(3) == pytest.approx(2.0)
    assert costs.relative(2) == pytest.approx(1.5)


def test_drafts_stop_short_of_a_row_count_timed_dear():
    """A draft length whose step was timed far dearer than the prior said (a kernel's
    few-row limit passed) is no longer proposed, though every draft is accepted."""
    proposer = NgramProposer(1, 1, row_cost=0.1)
    seq = Sequence([5] * 40, 40)
    for _ in range(8):
        draft = proposer.propose(seq, 4)
        proposer.record(seq, len(draft), len(draft))
    assert len(proposer.propose(seq, 4)) == 4
    for rows, seconds in ((1, 0.01), (2, 0.011), (3, 0.012), (4, 0.013), (5, 0.04)):
        for _ in range(MIN_SAMPLES):
            proposer.costs.record(rows, seconds)
    assert len(proposer.propose(seq, 4)) == 3


def test_the_engine_times_its_lone_decode_steps(tiny_model_dir):
    """Each step of one decoding sequence is timed under its row count; the prompt's and
    those of a batch are not."""
    llm = LLM(model=str(tiny_model_dir), speculative="ngram", num_speculative_tokens=3)
    timed = []
    llm.engine.scheduler.proposer.timed = lambda rows, seconds: timed.append(rows)
    prompt = [7, 8, 9] * 10
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert len(timed) == 19 - llm.engine.stats().accepted_tokens  # the first token's is not
    assert set(timed) <= {1, 2, 3, 4}
    timed.clear()
    llm.generate([prompt, prompt[:-1]], SamplingParams(temperature=0, max_tokens=20,
                                                       ignore_eos=True))
    assert len(timed) < 19

# ---- the acceptance test ---------------------------------------------------------------
def test_accept_draft_keeps_the_target_distribution():
    """For each draft token (likely, unlikely, impossible), the tokens returned over many
    draws are distributed as the target: a chi-square statistic under the 0.1% critical
    value of its degrees of freedom."""
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    draws = 8000
    for draft in (0, 3, 4):
        gen = torch.Generator().manual_seed(draft)
        counts = torch.zeros(5)
        for _ in range(draws):
            counts[accept_draft(probs, draft, gen)] += 1
        assert counts[4] == 0
        expected = probs[:4] * draws
        chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
        assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def test_accept_draft_with_all_the_mass_on_the_draft_keeps_it():
    probs = torch.tensor([0.0, 1.0, 0.0])
    assert {accept_draft(probs, 1, None) for _ in range(50)} == {1}
