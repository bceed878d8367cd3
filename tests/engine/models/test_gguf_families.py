"""The GGUF architectures of the Llama family, each a small random file in llama.cpp's layout
(see ``family_gguf.py``), read by the engine on its quantized path and by transformers.

Weights read value for value as transformers loads them; greedy tokens equal transformers
``generate``'s under batching, prefix caching, chunked prefill and preemption. transformers
reads every file here but for one thing: it ignores a Llama 3 file's ``rope_freqs``, so that
family is compared with transformers' Llama on the file's weights with its llama3 rope."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.loading.gguf_weights import read_gguf_weights
from pagedchat.kernels.quant import QuantizedWeight, dequantize
from tests.engine.models.family_gguf import Family, write_family_gguf
from tests.engine.models.test_gemma3 import greedy_tokens
from tests.engine.models.test_gemma3_gguf import ON_A_GPU

gguf = pytest.importorskip("gguf")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0,
               # Llama 3's is 8192: a short one puts the scaled frequencies in reach of the
               # prompts here
               "original_max_position_embeddings": 64}
FAMILIES = {
    "llama3": Family("llama", "Llama 3.2 1B Instruct", tied=True,
                     llama3_rope={k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"}),
    # llama.cpp writes Mistral as a llama file; transformers reads it as Llama
    "mistral": Family("llama", "Mistral 7B Instruct v0.3", heads=4, kv_heads=1,
                      rope_theta=1_000_000.0),
    "qwen2": Family("qwen2", "Qwen2.5 Coder 0.5B Instruct", tied=True, qkv_bias=True,
                    rope_theta=1_000_000.0),
    # transformers reads no head_dim from a qwen3 file: Qwen3's own 128 is what it takes
    "qwen3": Family("qwen3", "Qwen3 0.6B", heads=2, kv_heads=1, head_dim=128, tied=True,
                    qk_norm=True, rope_theta=1_000_000.0),
    "phi3": Family("phi3", "Phi 3 Mini 4k Instruct", heads=4, kv_heads=4, fused=True),
}
MAX_TOKENS = 12


def _prompts() -> list[list[int]]:
    """Prompts of 3 to 75 tokens, the last two sharing their first 32."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(10, 2000, (n,), generator=g).tolist() for n in (3, 15, 17, 40, 75)]
    return [*prompts, prompts[-1][:32] + torch.randint(10, 2000, (9,), generator=g).tolist()]


@pytest.fixture(scope="module")
def files(tmp_path_factory, small_tokenizer_gguf) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf-families")
    return {name: write_family_gguf(folder / f"{name}.gguf", small_tokenizer_gguf, family)
            for name, family in FAMILIES.items()}


def _transformers_model(path: Path):
    """transformers' model of the file, in float32; for a Llama 3 file, its weights in a
    Llama with the llama3 rope the file's ``rope_freqs`` were computed from."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    if path.stem != "llama3":
        return model
    config = model.config
    config.rope_parameters = {**LLAMA3_ROPE, "rope_theta": config.rope_parameters["rope_theta"]}
    scaled = LlamaForCausalLM(config).eval()
    scaled.load_state_dict(model.state_dict())
    return scaled


@pytest.fixture(scope="module")
def models(files) -> dict:
    return {name: _transformers_model(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def references(models) -> dict[str, list[list[int]]]:
    return {name: greedy_tokens(model, _prompts(), MAX_TOKENS) for name, model in models.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_weights_read_as_transformers_loads_them(files, models, name):
    family = FAMILIES[name]
    ours = read_gguf_weights(files[name], family.heads, family.kv_heads)
    theirs = models[name].state_dict()
    if family.tied:
        theirs.pop("lm_head.weight")
    assert set(ours) == set(theirs)
    for key, weight in ours.items():
        quantized = key.endswith("proj.weight") or "embed" in key or "lm_head" in key
        assert isinstance(weight, QuantizedWeight) == quantized, key
        assert torch.equal(dequantize(weight) if quantized else weight, theirs[key]), key


def test_llama3_rope_freqs_change_the_tokens(files, references):
    """Without the file's rope scaling (as transformers reads the file) the tokens differ:
    the Llama 3 comparison checks the scaling."""
    from transformers import AutoModelForCausalLM

    path = files["llama3"]
    plain = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    assert greedy_tokens(plain, _prompts()[3:5], MAX_TOKENS) != references["llama3"][3:5]


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("device", ["cpu", ON_A_GPU])
@pytest.mark.parametrize("options", [
    # every prompt in one batch; then again, from the prefix cache
    dict(block_size=16, num_kv_blocks=64),
    # preempts and chunks: the longest request fits, barely
    dict(block_size=4, num_kv_blocks=24, max_num_batched_tokens=24),
], ids=["batched-then-cached", "preempted"])
def test_greedy_matches_transformers(files, references, name, device, options):
    """On the CPU, the quantized path; on a GPU, the Triton backend on the weights
    de-quantized to float32."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    llm = LLM(model=str(files[name]), device=device, **options)
    assert llm.engine.config.weights == ("gguf" if device == "cpu" else "float32")
    outputs = llm.generate(_prompts(), params, use_progress=False)
    assert [o.outputs[0].token_ids for o in outputs] == references[name]
    if options["num_kv_blocks"] == 24:
        assert llm.engine.stats().preemptions > 0
        return
    again = llm.generate(_prompts(), params, use_progress=False)
    assert sum(o.num_cached_tokens for o in again) > 0
    assert [o.outputs[0].token_ids for o in again] == references[name]
