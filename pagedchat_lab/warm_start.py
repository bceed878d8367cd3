"""A long session reopened: time to first token with its KV blocks read back from the KV
store against computing its prompt again, on one engine whose pool forgets everything
between rounds (a restart, less the model's load), the two taking turns."""

from __future__ import annotations

import statistics
import time

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def first_token(engine: LLMEngine, prompt: list[int], rid: str,
                params: SamplingParams = GREEDY) -> tuple[float, RequestOutput]:
    """Seconds from add_request (reading the store included) to the first token, and the
    finished request."""
    start = time.perf_counter()
    engine.add_request(rid, prompt, params)
    spent = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if spent is None and output.outputs[0].token_ids:
                spent = time.perf_counter() - start
            if output.finished:
                return spent, output
    raise RuntimeError(f"request {rid} never finished")


def warm_against_cold(engine: LLMEngine, session: list[int], question: list[int],
                      rounds: int, check_tokens: int) -> dict[str, object]:
    """``session`` is answered once (its blocks go to the store), then each round asks
    ``question`` after it warm (the store read) and cold (the store set aside), the pool
    emptied before each; the greedy continuations of ``check_tokens`` are compared."""
    store = engine.kv_store
    first_token(engine, session, "session")
    prompt = session + question
    warm, cold, cached = [], [], 0
    for n in range(rounds):
        for name, times in (("warm", warm), ("cold", cold)):
            engine.reset_prefix_cache()
            engine.kv_store = store if name == "warm" else None
            spent, output = first_token(engine, prompt, f"{name}-{n}")
            hits = output.num_cached_tokens
            times.append(spent)
            cached = hits if name == "warm" else cached
    check = SamplingParams(temperature=0.0, max_tokens=check_tokens, ignore_eos=True)
    replies = []
    for name in ("warm", "cold"):
        engine.reset_prefix_cache()
        engine.kv_store = store if name == "warm" else None
        replies.append(first_token(engine, prompt, f"{name}-check", check)[1]
                       .outputs[0].token_ids)
    engine.kv_store = store
    return {"prompt_tokens": len(prompt), "warm_cached_tokens": cached,
            "warm_ttft_s": statistics.median(warm), "cold_ttft_s": statistics.median(cold),
            "speedup": statistics.median(c / w for c, w in zip(cold, warm, strict=True)),
            "greedy_identical": replies[0] == replies[1], "store_bytes": sum(
                p.stat().st_size for p in store.folder.iterdir())}
