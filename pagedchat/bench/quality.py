"""Does a lower-precision run still say the same thing? Greedy agreement on ShareGPT
chat prompts between pagedchat and transformers at one dtype, next to the noise floor
of that dtype (transformers at that dtype against transformers in float32)."""

from __future__ import annotations

import torch

from pagedchat.bench.peers import load_hf_model
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams


def shared_prefix_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy outputs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _hf_greedy(model, ids: list[int], max_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                             max_new_tokens=max_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


def greedy_agreement(engine: LLMEngine, prompts: list[list[int]],
                     max_tokens: int) -> dict[str, float]:
    """First-token agreement and mean shared prefix, pagedchat vs transformers at the
    engine's dtype, and transformers at that dtype vs transformers in float32."""
    dtype = engine.config.dtype
    folder = engine.model_files.weights_folder()
    hf = load_hf_model(folder, dtype)
    hf32 = hf if dtype == "float32" else load_hf_model(folder, "float32")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    ours = []
    for i, ids in enumerate(prompts):
        engine.add_request(f"quality-{i}", ids, params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
    ours = [finished[f"quality-{i}"] for i in range(len(prompts))]
    theirs = [_hf_greedy(hf, ids, max_tokens) for ids in prompts]
    reference = theirs if hf32 is hf else [_hf_greedy(hf32, ids, max_tokens) for ids in prompts]
    shared = [shared_prefix_len(a, b) for a, b in zip(ours, theirs)]
    floor = [shared_prefix_len(a, b) for a, b in zip(theirs, reference)]
    n = len(prompts)
    return {
        "prompts": n,
        "first_token_agreement": sum(s > 0 for s in shared) / n,
        "mean_shared_prefix_tokens": sum(shared) / n,
        "hf_vs_hf_float32_first_token_agreement": sum(s > 0 for s in floor) / n,
        "hf_vs_hf_float32_mean_shared_prefix_tokens": sum(floor) / n,
    }
