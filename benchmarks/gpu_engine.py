"""The engine on a CUDA GPU (Triton backend) against transformers on the same GPU.

Two checks on random-weight Llamas with the default model's tokenizer (the real weights
need not travel to the GPU machine; the wide init keeps greedy steps far from ties):

1. Exactness: greedy tokens of ``LLM.generate`` equal transformers ``generate`` run one
   prompt at a time, for several block sizes, all prompts batched, and a KV pool small
   enough to force preemption.
2. Throughput: output tokens/s of the engine and of transformers ``generate`` with static
   batching (left padding, best of the batch sizes given) on the same random prompts.
3. One decode step at batch 256 under ``torch.profiler``: wall time against the time the
   GPU spent in kernels, and the number of kernels launched.
4. int8 K/V (``--sections kv-int8``): greedy agreement with the activations' K/V, and with
   one fixed pool size the sequences that fit, preemptions and output tokens/s of each.

    python benchmarks/gpu_engine.py --tokenizer DIR --json results.json

``DIR`` is any folder with the SmolLM2 tokenizer files (the converted default model
folder has them). Needs CUDA; elsewhere it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# SmolLM2-135M's shape; "tiny" is the unit tests' model.
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--exact-prompts", type=int, default=24)
    p.add_argument("--exact-tokens", type=int, default=48)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--hf-batch-sizes", default="32,64,128")
    p.add_argument("--json", type=Path)
    p.add_argument("--sections", default="exactness,throughput,profile",
                   help="comma-separated: exactness, throughput, profile, kv-int8")
    p.add_argument("--kv-pool", default="64MiB", help="the pool of the kv-int8 comparison")
    return p.parse_args(argv)


def random_llama(folder: Path, tokenizer_dir: Path, shape: dict, init: float) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)
    config = LlamaConfig(vocab_size=49152, max_position_embeddings=2048,
                         tie_word_embeddings=True, initializer_range=init,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, **shape)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def random_prompts(count: int, low: int, high: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=gen)
    return [torch.randint(3, 49152, (int(n),), generator=gen).tolist() for n in lengths]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def hf_model(folder: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def hf_greedy(model, prompt: list[int], max_new: int, device: str) -> list[int]:
    ids = torch.tensor([prompt], device=device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                         min_new_tokens=max_new, do_sample=False, pad_token_id=2)
    return out[0, len(prompt):].tolist()


def check_exactness(folder: Path, args: argparse.Namespace) -> list[dict]:
    from pagedchat import LLM, SamplingParams

    prompts = random_prompts(args.exact_prompts, 3, 200, seed=1)
    model = hf_model(folder, torch.float32, args.device)
    expected = [hf_greedy(model, p, args.exact_tokens, args.device) for p in prompts]
    del model
    params = SamplingParams(temperature=0.0, max_tokens=args.exact_tokens, ignore_eos=True)
    longest = max(len(p) for p in prompts) + args.exact_tokens
    cases = []
    for block_size, kv_blocks in [(16, None), (8, None), (32, None),
                                  (16, 2 * -(-longest // 16))]:  # 2 sequences' worth: preempts
        llm = LLM(model=str(folder), device=args.device, block_size=block_size,
                  num_kv_blocks=kv_blocks)
        outs = llm.generate(prompts, params, use_progress=False)
        stats = llm.engine.stats()
        same = sum(o.outputs[0].token_ids == e for o, e in zip(outs, expected))
        cases.append({"block_size": block_size, "kv_blocks": llm.engine.config.num_kv_blocks,
                      "identical": same, "prompts": len(prompts),
                      "preemptions": stats.preemptions})
        print(f"exactness block {block_size}, {cases[-1]['kv_blocks']} blocks: "
              f"{same}/{len(prompts)} identical, preemptions {cases[-1]['preemptions']}")
        del llm
    return cases


def hf_throughput(model, prompts: list[list[int]], max_new: int, batch: int,
                  device: str) -> float:
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[2] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk],
                            device=device)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, pad_token_id=2)
        tokens += (out.shape[1] - width) * len(chunk)
    synchronize(device)
    return tokens / (time.perf_counter() - start)


def engine_throughput(llm, prompts: list[list[int]], params, device: str) -> tuple[float, float]:
    """Output tokens/s of ``llm`` on ``prompts`` (after a warm-up that compiles the
    kernels), and the seconds they took."""
    llm.generate(prompts[:8], params, use_progress=False)
    synchronize(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_progress=False)
    synchronize(device)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds, seconds


def compare_throughput(folder: Path, args: argparse.Namespace) -> dict:
    from pagedchat import LLM, SamplingParams

    prompts = random_prompts(args.requests, 16, 512, seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    llm = LLM(model=str(folder), device=args.device, dtype=args.dtype)
    ours, seconds = engine_throughput(llm, prompts, params, args.device)
    print(f"pagedchat {args.dtype}: {ours:.0f} output tok/s ({seconds:.1f} s)")
    del llm
    model = hf_model(folder, getattr(torch, args.dtype), args.device)
    hf_throughput(model, prompts[:4], 8, 4, args.device)  # warm up
    theirs = {}
    for batch in (int(b) for b in args.hf_batch_sizes.split(",")):
        theirs[batch] = hf_throughput(model, prompts, args.output_tokens, batch, args.device)
        print(f"transformers generate, batch {batch}: {theirs[batch]:.0f} output tok/s")
    best = max(theirs.values())
    print(f"ratio to the best static batch: {ours / best:.2f}x")
    return {"pagedchat_tok_s": ours, "hf_generate_tok_s": theirs, "ratio": ours / best,
            "requests": len(prompts), "output_tokens": args.output_tokens,
            "dtype": args.dtype}


def profile_decode_step(folder: Path, args: argparse.Namespace, batch: int = 256) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from pagedchat import LLM, SamplingParams

    llm = LLM(model=str(folder), device=args.device, dtype=args.dtype)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(batch, 100, 300, seed=3)):
        engine.add_request(str(i), prompt, params)
    while engine.stats().num_waiting > 0:  # every prompt in, then a few decode steps
        engine.step()
    for _ in range(5):
        engine.step()
    steps = 5
    synchronize(args.device)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        synchronize(args.device)
    wall = (time.perf_counter() - start) / steps * 1e3
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    result = {"batch": batch, "wall_ms": wall,
              "gpu_ms": sum(e.self_device_time_total for e in kernels) / steps / 1e3,
              "kernels_per_step": sum(e.count for e in kernels) / steps}
    print(f"decode step at batch {batch}, {args.dtype}: {wall:.1f} ms (profiled), GPU busy "
          f"{result['gpu_ms']:.1f} ms, {result['kernels_per_step']:.0f} kernels")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8))
    return result


def compare_kv_dtypes(tiny: Path, folder: Path, args: argparse.Namespace) -> dict:
    """int8 K/V on the device against the torch reference's int8 K/V on the CPU (greedy
    tokens of the ``tiny`` model in float32, whose wide init keeps steps far from ties:
    the same rows are stored, so the tokens should be identical) and against float32 K/V
    (tokens shared from the start); then on ``folder``'s model, with one fixed pool size,
    the pool's token capacity, output tokens/s and preemptions of each K/V dtype."""
    from pagedchat import LLM, SamplingParams

    prompts = random_prompts(args.exact_prompts, 3, 200, seed=1)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.exact_tokens, ignore_eos=True)

    def tiny_tokens(device: str, kv_dtype: str, backend: str = "auto") -> list[list[int]]:
        with LLM(model=str(tiny), device=device, dtype="float32", kv_cache_dtype=kv_dtype,
                 attention_backend=backend) as llm:
            return [o.outputs[0].token_ids
                    for o in llm.generate(prompts, greedy, use_progress=False)]

    int8 = tiny_tokens(args.device, "int8")
    reference = tiny_tokens("cpu", "int8", "torch")
    plain = tiny_tokens(args.device, "auto")
    identical = sum(a == b for a, b in zip(int8, reference, strict=True))
    shared = [next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), len(p))
              for p, q in zip(plain, int8, strict=True)]
    agreement = sum(shared) / sum(len(t) for t in plain)
    print(f"int8 K/V on {args.device} against the CPU reference's int8 K/V: {identical}/"
          f"{len(prompts)} identical; greedy prefix shared with float32 K/V: "
          f"{agreement:.1%} of tokens")
    result = {"identical_to_cpu_reference": identical, "prompts": len(prompts),
              "agreement_with_float32_kv": agreement, "pool": args.kv_pool,
              "dtype": args.dtype}

    load = random_prompts(args.requests, 16, 512, seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    for kv_dtype in ("auto", "int8"):
        llm = LLM(model=str(folder), device=args.device, dtype=args.dtype,
                  kv_cache_dtype=kv_dtype, kv_cache_memory=args.kv_pool)
        config = llm.engine.config
        run = {"pool_tokens": config.num_kv_blocks * config.block_size,
               "tok_s": engine_throughput(llm, load, params, args.device)[0],
               "preemptions": llm.engine.stats().preemptions}
        result.update({f"{kv_dtype}_{name}": value for name, value in run.items()})
        print(f"K/V {kv_dtype}, pool {args.kv_pool}: {run['pool_tokens']} tokens, "
              f"{run['tok_s']:.0f} output tok/s, {run['preemptions']} preemptions")
        del llm
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure")
        return 0
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda")
              else args.device, "torch": torch.__version__}
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        full = random_llama(Path(tmp) / "full", args.tokenizer, SHAPES["smollm2-135m"], 0.05)
        tiny = random_llama(Path(tmp) / "tiny", args.tokenizer, SHAPES["tiny"], 0.5)
        if "exactness" in sections:
            result["exactness_tiny"] = check_exactness(tiny, args)
            result["exactness_135m"] = check_exactness(full, args)
        if "throughput" in sections:
            result["throughput_135m"] = compare_throughput(full, args)
        if "profile" in sections and args.device.startswith("cuda"):
            result["decode_step_135m"] = profile_decode_step(full, args)
        if "kv-int8" in sections:
            result["kv_int8"] = compare_kv_dtypes(tiny, full, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
