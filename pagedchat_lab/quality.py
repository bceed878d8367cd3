"""Does a lower-precision run still say the same thing? Greedy agreement on ShareGPT
chat prompts between pagedchat and transformers at one dtype, next to the noise floor
of that dtype (transformers at that dtype against transformers in float32); and the
perplexity of held-out text (ShareGPT answers) as each scores it."""

from __future__ import annotations

import math

import torch

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab.hf import load_hf_model, weights_folder


def _run_alone(engine: LLMEngine, request_id: str, prompt: list[int],
               params: SamplingParams) -> RequestOutput:
    """One request through the engine with nothing beside it, as a single chat runs (its
    steps the same whatever else is asked)."""
    engine.add_request(request_id, prompt, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return out
    raise RuntimeError(f"{request_id} did not finish")


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
    """First-token agreement and mean shared prefix, pagedchat (each prompt alone) vs
    transformers at the engine's dtype, and transformers at that dtype vs transformers in
    float32."""
    dtype = engine.config.dtype
    folder = weights_folder(engine.model_files)
    hf = load_hf_model(folder, dtype)
    hf32 = hf if dtype == "float32" else load_hf_model(folder, "float32")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    ours = [_run_alone(engine, f"quality-{i}", ids, params).outputs[0].token_ids
            for i, ids in enumerate(prompts)]
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


def _forcing(reply: list[int]):
    """A logits processor that makes the next token the reply's next one."""
    def force(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(row, float("-inf"))
        forced[reply[len(output_ids)]] = 0.0
        return forced
    return force


def reply_logprobs(engine: LLMEngine, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
    """Each reply's log-probability under pagedchat given its prompt, token by token as it
    decodes alone (the reply forced in; logprobs are read before the forcing)."""
    scores = []
    for i, (prompt, reply) in enumerate(pairs):
        completion = _run_alone(engine, f"score-{i}", prompt, SamplingParams(
            temperature=0, max_tokens=len(reply), ignore_eos=True, logprobs=0,
            logits_processors=[_forcing(reply)])).outputs[0]
        scores.append(sum(entry[token].logprob for token, entry in zip(
            completion.token_ids, completion.logprobs, strict=True)))
    return scores


def _hf_reply_logprob(model, prompt: list[int], reply: list[int]) -> float:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1:-1]
    picked = logits.float().log_softmax(-1).gather(1, torch.tensor(reply).unsqueeze(1))
    return float(picked.sum())


def held_out_perplexity(engine: LLMEngine,
                        pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """Perplexity of the replies given their prompts, under pagedchat (as it decodes) and
    under transformers in float32 on the same weights."""
    hf = load_hf_model(weights_folder(engine.model_files), "float32")
    tokens = sum(len(reply) for _, reply in pairs)
    ours = sum(reply_logprobs(engine, pairs))
    theirs = sum(_hf_reply_logprob(hf, prompt, reply) for prompt, reply in pairs)
    return {"replies": len(pairs), "reply_tokens": tokens,
            "perplexity": math.exp(-ours / tokens),
            "hf_float32_perplexity": math.exp(-theirs / tokens)}
