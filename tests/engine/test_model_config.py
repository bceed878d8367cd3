"""The engine reads config.json and the tokenizer itself, as transformers would.

Loading through transformers' config classes costs heavy imports (rope helpers,
torch._dynamo, sympy); these tests pin that the shortcut reads the same values, builds the
same tokenizer, and that the heavy modules stay out of an engine process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.loading.loader import SOURCE_RECORD
from pagedchat.engine.loading.text_tokenizer import TextTokenizer
from pagedchat.engine.loading.tokenizer import load_tokenizer
from pagedchat.engine.model_config import ModelConfig

FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
          "max_position_embeddings", "tie_word_embeddings", "attention_bias", "eos_token_id")


@pytest.fixture(params=["tiny", pytest.param("real", marks=pytest.mark.slow)])
def folder(request, tiny_model_dir):
    return tiny_model_dir if request.param == "tiny" else request.getfixturevalue("real_model_dir")


def test_config_reads_what_transformers_reads(folder):
    from transformers import AutoConfig

    ours, theirs = ModelConfig.from_folder(folder), AutoConfig.from_pretrained(folder)
    for name in FIELDS:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.rope_type == theirs.rope_parameters["rope_type"]
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]


def test_older_config_files_are_read(tmp_path):
    """Before transformers 5: rope_theta at the top, rope_scaling with ``type``, no
    head_dim and no KV head count (= the query heads)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0}}))
    config = ModelConfig.from_folder(tmp_path)
    assert (config.head_dim, config.num_key_value_heads) == (16, 4)
    assert (config.rope_type, config.rope_theta) == ("linear", 500000.0)
    assert config.rope_parameters["factor"] == 2.0
    assert not config.tie_word_embeddings


@pytest.mark.parametrize("text, message", [
    ("{not json", "config.json"),
    (json.dumps({"model_type": "llama", "vocab_size": 10}), "missing hidden_size"),
])
def test_a_bad_config_is_named(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_folder(tmp_path)


def test_tokenizer_is_the_one_auto_tokenizer_gives(folder):
    """The same tokens, text, chat prompt and special ids; the same class for an HF folder,
    and for a folder converted from a GGUF (the real model's) the one without transformers."""
    from transformers import AutoTokenizer

    ours = load_tokenizer(ModelConfig.from_folder(folder))
    theirs = AutoTokenizer.from_pretrained(folder)
    converted = (folder / SOURCE_RECORD).is_file()
    assert type(ours) is (TextTokenizer if converted else type(theirs))
    texts = ["Hello, world!", "  spaces\tand\nnewlines  ", "héllo wörld ✓ 日本語", ""]
    for text in texts:
        assert ours.encode(text) == theirs.encode(text)
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    assert (ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    ids = theirs.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    if converted:
        assert ours.apply_chat_template(chat, add_generation_prompt=True) == ids
    if not converted:
        assert ours.all_special_ids == theirs.all_special_ids
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == (
        theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64, "rope_theta": 10000.0},
], ids=["linear", "llama3"])
def test_scaled_rope_matches_transformers(make_tiny_llama, rope):
    """Scaled rope types take transformers' formulas: greedy output equals its generate."""
    from transformers import AutoModelForCausalLM

    folder = make_tiny_llama(f"tiny-{rope['rope_type']}", rope_parameters=rope)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 49000, (n,), generator=gen).tolist() for n in (5, 90, 300)]
    llm = LLM(model=str(folder), num_kv_blocks=128)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16,
                                                   ignore_eos=True))
    for ids, out in zip(prompts, outputs):
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16,
                          do_sample=False, attention_mask=torch.ones(1, len(ids)))
        assert out.outputs[0].token_ids == ref[0, len(ids):].tolist()


def test_an_engine_process_leaves_the_compiler_stack_unloaded(tiny_model_dir):
    """What costs the memory: torch._dynamo and transformers' model config classes; and
    sympy, which ``Module.to_empty`` on meta tensors imports."""
    script = (
        "import sys\n"
        "from pagedchat import LLM, SamplingParams\n"
        f"llm = LLM(model={str(tiny_model_dir)!r}, num_kv_blocks=64)\n"
        "llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4))\n"
        "heavy = ['torch._dynamo', 'transformers.models.llama.configuration_llama', 'sympy']\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
