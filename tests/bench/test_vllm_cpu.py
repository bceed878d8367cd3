"""The vllm-cpu peer's protocol, against a stand-in ``vllm`` module in a child Python.

vLLM itself lives in a virtualenv of its own and is never installed by the test extras;
the stand-in serves every request one token a step, so the times the peer reports can be
checked against the steps."""

import sys
import textwrap

import pytest

from pagedchat_lab import vllm_cpu
from pagedchat_lab.peers import parse_peers
from pagedchat_lab.sharegpt import Request

STAND_IN = textwrap.dedent('''
    import time
    from types import SimpleNamespace

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class _Engine:
        def __init__(self):
            self.running = {}

        def add_request(self, request_id, prompt, params):
            assert params.temperature == 0.0 and params.ignore_eos
            assert params.min_tokens == params.max_tokens
            self.running[request_id] = [len(prompt["prompt_token_ids"]), params.max_tokens, []]

        def has_unfinished_requests(self):
            return bool(self.running)

        def step(self):
            time.sleep(0.001)
            outputs = []
            for request_id, state in list(self.running.items()):
                state[2].append(7)
                finished = len(state[2]) == state[1]
                outputs.append(SimpleNamespace(
                    request_id=request_id, finished=finished, num_cached_tokens=0,
                    outputs=[SimpleNamespace(token_ids=list(state[2]))]))
                if finished:
                    del self.running[request_id]
            return outputs

    class LLM:
        def __init__(self, model, dtype, **kwargs):
            if model == "missing":
                raise OSError("no model here")
            self.llm_engine = _Engine()
            self.resets = 0

        def reset_prefix_cache(self):
            self.resets += 1
''')


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "vllm.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_each_request_gets_its_tokens_at_their_steps(stand_in):
    peer = vllm_cpu.VllmCpu(sys.executable, stand_in, "float32", 2 << 30, max_num_seqs=8)
    try:
        requests = [Request("a", [1, 2, 3], 4), Request("b", [4, 5], 2),
                    Request("c", [6], 3)]
        done = []
        results = peer.run(requests, [0.0, 0.0, 0.05], done.append)
    finally:
        peer.close()
    assert sum(done) == 3
    assert [r.output_len for r in results] == [4, 2, 3]
    assert [r.prompt_len for r in results] == [3, 2, 1]
    for result in results:
        assert result.token_times == sorted(result.token_times)
        assert result.token_times[0] >= result.arrival
    # the late request is added only when its arrival has passed
    assert results[2].token_times[0] >= 0.05
    assert peer.label == "vllm-cpu-b8"


def test_a_child_that_fails_to_load_says_why(stand_in):
    with pytest.raises(RuntimeError, match="no model here"):
        vllm_cpu.VllmCpu(sys.executable, "missing", "float32", 1 << 30, max_num_seqs=4)


def test_a_missing_interpreter_says_how_to_make_one(tmp_path):
    with pytest.raises(ValueError, match="vllm-cpu"):
        vllm_cpu.VllmCpu(str(tmp_path / "nope" / "python"), tmp_path, "float32", 1 << 30, 4)


def test_the_peer_is_known_by_name():
    assert parse_peers("vllm-cpu,llama.cpp") == ["vllm-cpu", "llama.cpp"]
