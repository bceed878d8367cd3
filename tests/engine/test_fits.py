"""RequestFit: the one rule for whether a request fits, which the engine refuses by and
the server answers 413 and sizes a default max_tokens by."""

from __future__ import annotations

import pytest

from pagedchat.engine.errors import RequestError
from pagedchat.engine.fits import RequestFit
from pagedchat.engine.sampling_params import SamplingParams

GLOBAL = RequestFit(16, (None,), 1024, 64, 8, num_blocks=40)
# Gemma 3's shape: a global group and a local one with a 32-token window
WINDOWED = RequestFit(16, (None, 32), 1024, 64, 8, num_blocks=40)


def test_blocks_count_every_group_and_sequence_unshared():
    assert GLOBAL.blocks(40, 9, 1) == 4  # 49 tokens in blocks of 16
    assert GLOBAL.blocks(40, 9, 3) == 12
    assert GLOBAL.blocks(1000, 1000, 1) == 64  # capped at the context
    # the local group holds its window and one chunk: (31 + 64) / 16 -> 6, + 1
    assert WINDOWED.blocks(500, 0, 1) == 32 + 7


@pytest.mark.parametrize("fit", [GLOBAL, WINDOWED], ids=["global", "windowed"])
@pytest.mark.parametrize("sequences", [1, 2, 3, 7])
def test_longest_is_the_most_tokens_that_fit(fit, sequences):
    longest = fit.longest(sequences)
    assert fit.blocks(longest, 0, sequences) <= fit.num_blocks
    assert longest == fit.max_model_len or fit.blocks(longest + 1, 0, sequences) > fit.num_blocks


def test_longest_is_the_servers_old_formula_without_windows():
    for sequences in (1, 2, 3, 7):
        assert GLOBAL.longest(sequences) == min(1024, 40 // sequences * 16)


def test_check_refuses_what_can_never_run():
    longest = WINDOWED.longest(2)
    WINDOWED.check(100, SamplingParams(n=2, max_tokens=longest - 100))
    with pytest.raises(RequestError, match="needs up to .* whole pool has 40") as error:
        WINDOWED.check(100, SamplingParams(n=2, max_tokens=longest - 99))
    assert error.value.param == "max_tokens"
    with pytest.raises(RequestError, match="max_num_seqs=8") as error:
        GLOBAL.check(10, SamplingParams(n=9, max_tokens=1))
    assert error.value.param == "n"


def test_the_engine_and_its_scheduler_share_one_rule(tiny_llm):
    engine = tiny_llm.engine
    assert engine.request_fit is engine.scheduler.fit
    assert engine.request_fit.num_blocks == engine.config.num_kv_blocks
    assert engine.request_fit.max_model_len == engine.config.max_model_len
