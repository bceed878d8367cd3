"""Tensor parallelism on gloo: k workers give the same greedy tokens as one, with prefix
caching and under preemption; a size that does not divide the heads is refused; a dead
worker ends the engine with an error naming it; shutdown leaves no process behind."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from pagedchat import LLM, SamplingParams
from pagedchat.engine.errors import RequestError, WorkerError
from pagedchat.engine.runner.protocol import Runner

GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
# SmolLM2 on three workers: each step waits on all three sharing two cores, so fewer steps
SHORT = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SYSTEM = ("You are a terse assistant who answers questions about cooking, gardening and "
          "travel. Keep every answer under three sentences and never guess.")
QUESTIONS = ["How long do I boil an egg?", "When should tomatoes be planted?",
             "Is Lisbon worth a visit in winter?", "What is a roux?",
             "How often do I water basil?", "Which train goes from Paris to Milan?"]
PLAIN = ["The capital of France is", "1 2 3 4 5 6", "Once upon a time, in a small village,",
         "def fibonacci(n):"]


def _prompts(tokenizer) -> list[list[int]]:
    """Chats that share a system prompt (several blocks long) and plain prompts."""
    chats = [tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        tokenize=True, add_generation_prompt=True) for q in QUESTIONS]
    chats = [list(c["input_ids"] if hasattr(c, "keys") else c) for c in chats]
    return chats + [tokenizer.encode(p) for p in PLAIN]


def _tokens(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def _run_sharded(model_dir, prompts, k: int, params: SamplingParams = GREEDY, **options):
    """Warm the prefix cache with the first prompt, then run the rest together."""
    with LLM(model=str(model_dir), tensor_parallel_size=k, block_size=16,
             swap_space="16MiB", **options) as llm:
        assert isinstance(llm.engine.runner, Runner)
        first = llm.generate(prompts[:1], params)
        rest = llm.generate(prompts[1:], params)
        return first + rest, llm.engine.stats(), llm.engine.runner.workers


@pytest.fixture(scope="module")
def tiny_prompts(tiny_tp_model_dir):
    from transformers import AutoTokenizer

    return _prompts(AutoTokenizer.from_pretrained(tiny_tp_model_dir))


@pytest.fixture(scope="module")
def tiny_reference(tiny_tp_model_dir, tiny_prompts):
    """One worker, a pool large enough for everything, no prefix cache."""
    llm = LLM(model=str(tiny_tp_model_dir), num_kv_blocks=512, enable_prefix_caching=False)
    return _tokens(llm.generate(tiny_prompts, GREEDY))


@pytest.mark.parametrize(("k", "mode"), [(2, "recompute"), (4, "swap")])
def test_tiny_llama_sharded_greedy_is_token_identical(
    k, mode, tiny_tp_model_dir, tiny_prompts, tiny_reference
):
    outputs, stats, workers = _run_sharded(tiny_tp_model_dir, tiny_prompts, k,
                                           num_kv_blocks=20, preemption_mode=mode)
    assert _tokens(outputs) == tiny_reference
    assert stats.preemptions > 0, "the pool must be small enough to preempt"
    if mode == "swap":
        assert stats.swapped_out > 0 and stats.swapped_in == stats.swapped_out
    assert sum(out.num_cached_tokens for out in outputs[1:len(QUESTIONS)]) >= 16
    assert stats.used_blocks == 0
    assert len(workers) == k - 1 and not any(w.is_alive() for w in workers)
    assert all(w.exitcode == 0 for w in workers)


def test_a_sharded_regenerate_computes_no_prompt_token(tiny_tp_model_dir, tiny_prompts,
                                                      tiny_reference):
    """Every worker keeps the prompt's last row in the slot the step names, so the same
    prompt again samples from it on every rank (each its share of the vocabulary)."""
    with LLM(model=str(tiny_tp_model_dir), tensor_parallel_size=2, block_size=16,
             num_kv_blocks=64, swap_space="16MiB") as llm:
        first = llm.generate(tiny_prompts[:1], GREEDY)[0]
        again = llm.generate(tiny_prompts[:1], GREEDY)[0]
    assert again.num_cached_tokens == len(tiny_prompts[0])
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == tiny_reference[0]


def test_size_that_does_not_divide_the_heads_is_refused(tiny_tp_model_dir):
    with pytest.raises(RequestError, match=r"tensor_parallel_size=3 .*sizes that work: 1, 2, 4"):
        LLM(model=str(tiny_tp_model_dir), tensor_parallel_size=3)


def test_more_ranks_than_cores_are_warned_of(tiny_tp_model_dir, monkeypatch, caplog):
    from pagedchat.engine.parallel import parallel_runner

    monkeypatch.setattr(parallel_runner, "usable_cores", lambda: 1)
    with caplog.at_level(logging.WARNING, logger=parallel_runner.__name__), \
            LLM(model=str(tiny_tp_model_dir), tensor_parallel_size=2, num_kv_blocks=16) as llm:
        assert llm.engine.runner.threads == 1
    assert "tensor_parallel_size=2 on 1 usable cores" in caplog.text


def test_killed_worker_ends_the_engine_with_an_error_naming_it(tiny_tp_model_dir, monkeypatch):
    llm = LLM(model=str(tiny_tp_model_dir), tensor_parallel_size=2, num_kv_blocks=128)
    engine = llm.engine
    worker = engine.runner.workers[0]
    engine.add_request("long", "Tell me a story", SamplingParams(max_tokens=1000, ignore_eos=True))
    engine.step()
    killed = threading.Event()

    def kill() -> None:
        os.kill(worker.pid, signal.SIGKILL)
        killed.set()

    threading.Timer(0.3, kill).start()
    with pytest.raises(WorkerError, match=r"worker rank 1 \(pid \d+\) was killed by SIGKILL"):
        while engine.has_unfinished_requests():
            engine.step()
    assert killed.is_set()
    calls = []

    def refuse(*args) -> None:
        calls.append(args)
        raise RuntimeError("a stopped engine called the broken group")

    monkeypatch.setattr(engine.runner.tp, "broadcast", refuse)
    with pytest.raises(WorkerError, match="rank 1"):
        engine.step()  # the engine stays stopped and says why, without waiting on the group
    assert not calls
    monkeypatch.undo()
    llm.shutdown()
    assert not worker.is_alive()


@pytest.mark.slow
def test_smollm2_on_three_workers_matches_one(real_model_dir, shared_model_loads):
    """SmolLM2's 9 query and 3 KV heads split only by 3."""
    from transformers import AutoTokenizer

    prompts = _prompts(AutoTokenizer.from_pretrained(real_model_dir))
    reference = LLM(model=str(real_model_dir), num_kv_blocks=256, enable_prefix_caching=False)
    expected = _tokens(reference.generate(prompts, SHORT))
    with pytest.raises(RequestError, match="sizes that work: 1, 3"):
        LLM(model=str(real_model_dir), tensor_parallel_size=2)
    outputs, stats, _ = _run_sharded(real_model_dir, prompts, 3, SHORT, num_kv_blocks=12)
    assert _tokens(outputs) == expected
    assert stats.preemptions > 0
    assert sum(out.num_cached_tokens for out in outputs[1:len(QUESTIONS)]) >= 16
