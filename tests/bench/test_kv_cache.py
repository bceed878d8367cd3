"""bench kv-cache's measures on the tiny model: the forced-agreement method, bytes per
token, and sequences before the first preemption in one pool."""

from __future__ import annotations

from pagedchat_lab.kv_cache import agreement, bytes_per_token, running_before_preemption
from pagedchat_lab.suite import EngineOptions


def test_kv_measures(tiny_model_dir):
    base = EngineOptions(model=str(tiny_model_dir), kv_cache_memory="512KiB")
    plain, int8 = base.build(), base.with_(kv_cache_dtype="int8").build()
    prompts = [[5, 6, 7], list(range(20, 60)), list(range(100, 117))]
    same = agreement(plain, plain, prompts, 6)  # an engine agrees with itself throughout
    assert same == {"prompts": 3, "tokens": 18, "token_agreement": 1.0,
                    "mean_shared_prefix_tokens": 6.0, "identical_replies": 1.0}
    measured = agreement(int8, plain, prompts, 6)
    assert measured["tokens"] == 18 and 0.5 <= measured["token_agreement"] <= 1.0
    assert bytes_per_token(int8) / bytes_per_token(plain) == 18 / 64  # heads of 16
    counts = [running_before_preemption(e, 64, 256, 100) for e in (plain, int8)]
    assert counts[0] > 0 and counts[1] >= 3 * counts[0]
