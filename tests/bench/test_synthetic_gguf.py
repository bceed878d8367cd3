"""The random-weight GGUF writer, on its tiny shape: the file reads back as written, and
pagedchat and transformers load it to the same model (greedy tokens identical)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from pagedchat.engine.loading.loader import default_model_path, prepare_model
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab.synthetic_gguf import SHAPES, quant_types, synthetic_model, write_gguf

TINY = SHAPES["tiny"]


def test_reads_back_with_the_shape_and_tokenizer_asked_for(tiny_gguf, small_tokenizer_gguf):
    reader = gguf.GGUFReader(tiny_gguf)
    source = gguf.GGUFReader(small_tokenizer_gguf)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.embedding_length"].contents() == TINY.hidden
    assert reader.fields["llama.block_count"].contents() == TINY.layers
    assert reader.fields["llama.attention.head_count_kv"].contents() == TINY.kv_heads
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"):
        assert reader.fields[key].contents() == source.fields[key].contents()
    tensors = {t.name: t for t in reader.tensors}
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    assert len(tensors) == 2 + 9 * TINY.layers
    assert tensors["blk.1.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(tensors["blk.1.ffn_down.weight"].shape) == [TINY.intermediate, TINY.hidden]
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert sum(int(t.n_elements) for t in reader.tensors) == TINY.parameters(vocab)
    # the weights are the seed's draw, to Q8_0's precision
    embedding = gguf.quants.dequantize(tensors["token_embd.weight"].data,
                                       gguf.GGMLQuantizationType.Q8_0)
    assert embedding.shape == (vocab, TINY.hidden)
    assert 0.45 < float(np.std(embedding)) < 0.55


def test_same_seed_same_file_other_seed_other_weights(tiny_gguf, small_tokenizer_gguf,
                                                     tmp_path):
    again, other = tmp_path / "again.gguf", tmp_path / "other.gguf"
    write_gguf(again, TINY, small_tokenizer_gguf, "Q8_0", seed=3, std=0.5)
    write_gguf(other, TINY, small_tokenizer_gguf, "Q8_0", seed=4, std=0.5)
    assert again.read_bytes() == tiny_gguf.read_bytes()
    assert other.read_bytes() != tiny_gguf.read_bytes()


def test_pagedchat_and_transformers_load_it_to_the_same_greedy_tokens(tiny_gguf):
    from transformers import AutoModelForCausalLM

    from pagedchat import LLM

    llm = LLM(model=str(tiny_gguf), num_kv_blocks=64)
    prompts = [llm.tokenizer.encode(text) for text in
               ("The weather in Paris is", "def fibonacci(n):", "Paging KV memory")]
    ours = [out.outputs[0].token_ids for out in llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    hf = AutoModelForCausalLM.from_pretrained(prepare_model(tiny_gguf).folder,
                                              dtype=torch.float32).eval()
    for ids, tokens in zip(prompts, ours):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                              max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert tokens == out[0, len(ids):].tolist()
    assert len({tuple(t) for t in ours}) > 1  # the prompts lead somewhere different


def test_cached_by_shape_quant_and_seed(monkeypatch, tmp_path, small_tokenizer_gguf):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    path, found = synthetic_model("tiny", "Q8_0", seed=1, tokenizer_gguf=small_tokenizer_gguf)
    assert not found and path.is_file() and path.is_relative_to(tmp_path)
    assert synthetic_model("tiny", "Q8_0", seed=1) == (path, True)
    assert not list(path.parent.glob(".*partial"))


def test_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="unknown size"):
        synthetic_model("7b")
    with pytest.raises(ValueError, match="cannot quantize to IQ2_XS"):
        write_gguf(tmp_path / "x.gguf", TINY, default_model_path(), "IQ2_XS")
    assert "Q8_0" in quant_types()


def test_the_command_prints_the_cached_path(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from pagedchat.cli import app

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    runner = CliRunner()
    first = runner.invoke(app, ["bench", "synth-model", "--size", "tiny", "--seed", "2"])
    assert first.exit_code == 0, first.output
    path = tmp_path / "synthetic" / "llama-tiny-Q8_0-seed2-v1.gguf"
    assert first.stdout.strip() == str(path) and path.is_file()
    again = runner.invoke(app, ["bench", "synth-model", "--size", "tiny", "--seed", "2"])
    assert again.stdout.strip() == str(path)
    bad = runner.invoke(app, ["bench", "synth-model", "--quant", "Q3_K"])
    assert bad.exit_code == 1 and "cannot quantize to Q3_K" in bad.output
