"""The tokenizer read without transformers gives transformers' ids, text and chat prompts."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from pagedchat.engine.loading.chat_template import render_chat
from pagedchat.engine.loading.loader import prepare_model
from pagedchat.engine.loading.named_models import NAMED_MODELS, is_installed
from pagedchat.engine.loading.text_tokenizer import CompactTokenizer, TextTokenizer
from pagedchat.engine.loading.tokenizer import load_hf_tokenizer, load_tokenizer
from pagedchat.engine.model_config import ModelConfig
from pagedchat_lab.sharegpt import conversations

TEXTS = ["Hello world", " leading space", "Ünïcödé 😀 日本語\n\n  x",
         "def f(x):\n    return x**2\n",
         "<|im_start|>user special tokens in text<|im_end|> <bos> </s>", "tabs\tand  spaces  ", ""]
CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "Ünïcödé 😀\n\n  and"}],
    [{"role": "user", "content": "Go on:"}, {"role": "assistant", "content": "Once upon a "}],
]


def assert_same_as_transformers(folder) -> None:
    config = ModelConfig.from_folder(folder)
    ours, theirs = load_tokenizer(config), load_hf_tokenizer(config)
    assert isinstance(ours, TextTokenizer)
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == \
                theirs.encode(text, add_special_tokens=special), (text, special)
    ids = list(range(0, len(theirs), max(1, len(theirs) // 997))) + theirs.encode(TEXTS[2])
    ids.append(theirs.eos_token_id)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == \
            theirs.decode(ids, skip_special_tokens=skip)
    assert [ours.convert_ids_to_tokens(i) for i in ids] == \
        [theirs.convert_ids_to_tokens(i) for i in ids]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == \
        (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id)
    assert len(ours) == len(theirs)
    assert bool(ours.chat_template) == bool(theirs.chat_template)
    if not ours.chat_template:
        return
    for conversation in CONVERSATIONS:
        for options in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                        {"continue_final_message": True}):
            assert ours.apply_chat_template(conversation, tokenize=False, **options) == \
                theirs.apply_chat_template(conversation, tokenize=False, **options)
            assert ours.apply_chat_template(conversation, **options) == \
                theirs.apply_chat_template(conversation, **options)["input_ids"]


def test_a_converted_gguf_gets_the_text_tokenizer(tmp_path, monkeypatch, small_vocab_model_dir):
    from tests.engine.loading.test_gguf_weights import write_tiny_gguf

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf(small_vocab_model_dir, tmp_path / "tiny.gguf", {})
    assert_same_as_transformers(prepare_model(path, weights="gguf").folder)


def test_an_hf_folder_keeps_transformers_tokenizer(tiny_model_dir):
    tokenizer = load_tokenizer(ModelConfig.from_folder(tiny_model_dir))
    assert not isinstance(tokenizer, TextTokenizer)


TEMPLATE = (
    "{%- set ns = namespace(turns=0) -%}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% if loop.index > 9 %}{% break %}{% endif %}"
    "{{ bos_token }}{{ message['role'] }}: {{ message['content'] | tojson }}\n"
    "{% if message.get('reasoning_content') %}({{ message['thinking'] }}){% endif %}"
    "{% generation %}{{ dict(a=1) | tojson }}{% endgeneration %}\n"
    "{% endfor %}{{ ns.turns }}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.mark.parametrize("options", [{"add_generation_prompt": True},
                                     {"continue_final_message": True}])
def test_templates_render_as_transformers_renders_them(options):
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "héllo \"quoted\" 😀"},
                {"role": "assistant", "content": "thinking aloud", "reasoning": "hmm"}]
    ours = render_chat(TEMPLATE, messages, bos_token="<s>", **options)
    theirs, _ = render_jinja_template([messages], chat_template=TEMPLATE, bos_token="<s>",
                                      **options)
    assert ours == theirs[0]


def test_a_template_that_refuses_raises_its_message():
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="no tools"):
        render_chat(TEMPLATE, [{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat(TEMPLATE, [])


@pytest.mark.slow
def test_the_default_model_tokenizes_as_transformers(real_model_dir):
    assert_same_as_transformers(prepare_model(None, weights="gguf").folder)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "gemma-3-270m"])
def test_named_models_tokenize_as_transformers(name):
    if not is_installed(NAMED_MODELS[name]):
        pytest.skip(f"{name} is not installed")
    folder = prepare_model(name, weights="gguf").folder
    assert_same_as_transformers(folder)
    # Gemma's tokenizer.json has the shape of the compact tokenizer (bpe.c); Qwen's has not
    ours = load_tokenizer(ModelConfig.from_folder(folder))
    assert isinstance(ours.backend, CompactTokenizer) == (name == "gemma-3-270m")
    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for conversation in conversations()[:300]:
        for message in conversation.messages:
            assert ours.encode(message["content"]) == library.encode(message["content"]).ids
