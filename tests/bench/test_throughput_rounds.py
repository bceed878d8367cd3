"""Rounds of a throughput comparison: a peer that fails is named and left out, the others go on."""

import pytest

from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request
from pagedchat_lab.throughput import run_rounds, summarize


class StepPeer:
    """A peer that gives each request one token per ``step`` seconds after its arrival."""

    def __init__(self, label: str, step: float) -> None:
        self.name = self.label = label
        self.step = step
        self.setting = {"step": step}

    def reset(self):
        pass

    def run(self, requests, arrivals, advance):
        results = []
        for request, arrival in zip(requests, arrivals, strict=True):
            times = [arrival + self.step * (k + 1) for k in range(request.output_len)]
            results.append(RequestResult(request.prompt_len, arrival, times))
            advance(1)
        return results


class FailingPeer(StepPeer):
    def run(self, requests, arrivals, advance):
        raise MemoryError("footprint over the memory available")


REQUESTS = [Request("a", [1, 2, 3], 4), Request("b", [4, 5], 2)]


def first_run(ours):
    return {"output_tokens_per_s": 1 / ours.step}


@pytest.mark.parametrize("rounds", [1, 2])
def test_failing_peer_is_named_and_left_out(capsys, rounds):
    ours, good, bad = StepPeer("ours", 0.5), StepPeer("good", 1.0), FailingPeer("bad", 1.0)
    peers = [bad, good]
    runs = run_rounds(ours, peers, REQUESTS, [1, 2], rounds, first_run(ours))
    assert peers == [good]
    assert set(runs) == {"ours", "good"}
    assert len(runs["good"]) == rounds
    assert "bad could not run: MemoryError: footprint over the memory available" in (
        capsys.readouterr().err)
    _, rows = summarize(runs, ours, peers, {})
    assert [row["engine"] for row in rows] == ["ours", "good"]


def test_our_own_failure_is_not_hidden():
    ours = FailingPeer("ours", 1.0)
    with pytest.raises(MemoryError):
        run_rounds(ours, [StepPeer("good", 1.0)], REQUESTS, [1, 2], 2, {})


def test_hf_continuous_gets_the_pool_bytes_in_tokens_of_every_layer(tmp_path, tiny_tokenizer):
    """A page holds one layer group's K/V, so the pool's pages are fewer whole-model tokens
    than pages x block size on a model with several groups."""
    from pagedchat import LLM
    from pagedchat_lab.peers import PeerSettings, make_peers
    from tests.engine.models.test_gemma3 import save_tiny_gemma3

    folder = save_tiny_gemma3(tmp_path, tiny_tokenizer)
    with LLM(model=str(folder), block_size=4, num_kv_blocks=96) as llm:
        engine = llm.engine
        (peer,) = make_peers(["hf-continuous"],
                             PeerSettings(engine, [], 16, hf_max_requests=(8,)))
        groups = engine.runner.kv_groups
        assert groups.num_groups > 1
        layers = len(groups.layer_group)
        token_bytes = engine.runner.block_bytes // (groups.layers_per_page * 4) * layers
        assert peer.kv_tokens * token_bytes == 96 * engine.runner.block_bytes
