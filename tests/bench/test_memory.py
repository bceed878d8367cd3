"""Fig. 2 accounting: reservation policies and the contiguous simulator."""

from __future__ import annotations

import pytest

from pagedchat.engine.outputs import EngineStats
from pagedchat_lab.memory import PARTS, Tally, reservation, simulate_contiguous
from pagedchat_lab.sharegpt import Request


def req(prompt: int, output: int, name: str = "r") -> Request:
    return Request(name, [1] * prompt, output)


def test_reservations():
    r = req(10, 25)
    assert reservation("max-length", r, 2048) == 2048
    assert reservation("power-of-two", r, 2048) == 10 + 32
    assert reservation("power-of-two", req(10, 32), 2048) == 42
    assert reservation("oracle", r, 2048) == 35
    with pytest.raises(ValueError, match="unknown policy"):
        reservation("lucky", r, 2048)


def _run(policy, requests, capacity=100, max_len=50):
    return simulate_contiguous(requests, policy, capacity, max_len, max_num_seqs=64,
                               max_batched_tokens=2048)


def test_batch_size_under_the_same_budget():
    trace = [req(10, 10) for _ in range(12)]
    assert _run("max-length", trace)["max_batch_size"] == 2   # 50-slot chunks
    assert _run("oracle", trace)["max_batch_size"] == 5       # 20-slot chunks
    assert _run("power-of-two", trace)["max_batch_size"] == 3  # 10 + 16 = 26-slot chunks


def test_shares_sum_to_one_and_oracle_has_no_internal_waste():
    trace = [req(10, 10 + i % 7) for i in range(20)]
    for policy in ("max-length", "power-of-two", "oracle"):
        figures = _run(policy, trace)
        assert sum(figures[p] for p in PARTS) == pytest.approx(1.0)
    assert _run("oracle", trace)["internal_fragmentation"] == 0
    max_length = _run("max-length", trace)
    assert max_length["internal_fragmentation"] > 0.4  # at least 50 - 16 - 10 of 50 per chunk


def test_external_fragmentation_when_free_space_is_split():
    # a, b, c fill 30 slots; a and c finish first and leave two 10-slot holes around b;
    # d needs 20 contiguous slots: 20 are free, but not in one piece.
    trace = [req(6, 4, "a"), req(2, 8, "b"), req(6, 4, "c"), req(10, 10, "d")]
    figures = simulate_contiguous(trace, "oracle", 30, 40, 64, 2048)
    assert figures["external_fragmentation"] > 0
    assert figures["max_batch_size"] == 3


def test_request_larger_than_budget_is_refused():
    with pytest.raises(ValueError, match="budget"):
        _run("max-length", [req(10, 10)], capacity=40, max_len=50)


def test_paged_sample_only_while_requests_wait():
    def stats(waiting: int) -> EngineStats:
        return EngineStats(
            total_blocks=10, block_size=4, used_blocks=6, free_blocks=4, cached_blocks=0,
            live_tokens=21, empty_slots=3, utilization=21 / 24, internal_fragmentation=3 / 24,
            shared_blocks=0, saved_blocks=0, prefix_queries=0, prefix_hits=0,
            prefix_hit_rate=0.0, preemptions=0, swapped_out=0, swapped_in=0,
            host_blocks_used=0, num_running=3, num_waiting=waiting, num_swapped=0)

    tally = Tally(capacity=40)
    tally.add_paged(stats(0))
    assert tally.samples == 0
    tally.add_paged(stats(2))
    figures = tally.figures()
    assert figures["token_states"] == pytest.approx(21 / 40)
    assert figures["internal_fragmentation"] == pytest.approx(3 / 40)
    assert figures["free"] == pytest.approx(16 / 40)
    assert figures["live_of_allocated"] == pytest.approx(21 / 24)
    assert figures["mean_batch_size"] == 3
