"""bpe.c gives the tokenizers library's ids, text and tokens for a SentencePiece-style
tokenizer.json (Gemma's shape), escapes and all, and refuses any other shape, which the
tokenizers library then reads."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from pagedchat.engine.loading import text_tokenizer
from pagedchat.engine.loading.text_tokenizer import CompactTokenizer, TextTokenizer
from pagedchat.kernels.cpu import build

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<unused0>",
           "<unused10>"]
PLAIN_ADDED = ["\n\n", "\n\n\n", "\t\t"]
# (left, right) in rank order
MERGES = [("a", "b"), ("▁", "a"), ("b", "c"), ("ab", "c"), ("a", "a"), ("aa", "aa"), ("▁", "▁"),
          ("▁a", "b"), ("e", "é"), ("d", "e"), ("c", "d"), ("▁▁", "▁▁"), ("cd", "e")]
# pieces of text the vocabulary knows, spells with byte fallback (日, 😀, x), or splits at
PIECES = ["a", "b", "c", "d", "e", "é", "𝔘", " ", "▁", "日", "😀", "x", "\n", "\t", "<", ">",
          *SPECIAL, *PLAIN_ADDED, "<unused1>", "<0x41>"]


def spm_tokenizer() -> Tokenizer:
    """A small tokenizer.json in Gemma 3's layout: its normalizer, pre-tokenizer, decoders,
    post-processor, byte fallback and added tokens."""
    tokens = [*SPECIAL, *PLAIN_ADDED, *(f"<0x{byte:02X}>" for byte in range(256)),
              "a", "b", "c", "d", "e", "é", "𝔘", "▁", "\n", "\t", "<", ">"]
    tokens += dict.fromkeys(left + right for left, right in MERGES if left + right not in tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(BPE(vocab, list(MERGES), unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    tokenizer.add_special_tokens([AddedToken(token, normalized=False) for token in SPECIAL])
    tokenizer.add_tokens([AddedToken(token, normalized=False) for token in PLAIN_ADDED])
    return tokenizer


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tokenizers library's tokenizer and bpe.c's, of one tokenizer.json."""
    folder = tmp_path_factory.mktemp("spm")
    layout = json.loads(spm_tokenizer().to_str())
    # ("c", "d") listed once more, before ("d", "e"): its later listing is the one that counts
    layout["model"]["merges"].insert(4, ["c", "d"])
    # every character outside ASCII written as a \u escape (a surrogate pair past U+FFFF)
    (folder / "tokenizer.json").write_text(json.dumps(layout, indent=1, ensure_ascii=True))
    theirs = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ours = CompactTokenizer.load(folder / "tokenizer.json")
    assert ours is not None
    return theirs, ours, folder


TEXTS = st.one_of(st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
                  st.text(st.characters(exclude_categories=("Cs",)), max_size=60))


@settings(max_examples=400, deadline=None)
@given(text=TEXTS, special=st.booleans())
@example(text="cde ab", special=False)
def test_ids_are_the_tokenizers_librarys(pair, text, special):
    theirs, ours, _ = pair
    assert ours.encode(text, special).ids == theirs.encode(text, add_special_tokens=special).ids


@settings(max_examples=400, deadline=None)
@given(ids=st.lists(st.integers(0, 320), max_size=30), skip=st.booleans())
def test_text_is_the_tokenizers_librarys(pair, ids, skip):
    theirs, ours, _ = pair
    assert ours.decode(ids, skip) == theirs.decode(ids, skip_special_tokens=skip)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS, skip=st.booleans())
def test_encoded_text_decodes_as_the_tokenizers_library_decodes_it(pair, text, skip):
    theirs, ours, _ = pair
    ids = theirs.encode(text).ids  # characters outside the vocabulary as runs of byte tokens
    assert ours.decode(ids, skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_tokens_and_their_ids_are_the_tokenizers_librarys(pair):
    theirs, ours, _ = pair
    size = theirs.get_vocab_size(with_added_tokens=True)
    assert ours.get_vocab_size(with_added_tokens=True) == size
    for token_id in range(-1, size + 2):
        token = theirs.id_to_token(token_id) if token_id >= 0 else None
        assert ours.id_to_token(token_id) == token
        if token is not None:
            assert ours.token_to_id(token) == theirs.token_to_id(token) == token_id
    assert ours.token_to_id("not a token") is None


def layout_with(change) -> dict:
    layout = json.loads(spm_tokenizer().to_str())
    change(layout)
    return layout


@pytest.mark.parametrize("change", [
    lambda layout: layout.update(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False,
                                                "trim_offsets": True, "use_regex": True}),
    lambda layout: layout.update(normalizer=None),
    lambda layout: layout["added_tokens"][4].update(lstrip=True),
    lambda layout: layout["model"].update(byte_fallback=False),
    lambda layout: layout["model"]["vocab"].update(
        {"<0x4I>": layout["model"]["vocab"].pop("<0x41>")}),  # 'A' has no byte token
    lambda layout: layout.update(post_processor=None),
], ids=["byte-level", "no normalizer", "lstrip", "no byte fallback", "a byte missing",
        "no bos"])
def test_another_shape_is_left_to_the_tokenizers_library(tmp_path, change):
    (tmp_path / "tokenizer.json").write_text(json.dumps(layout_with(change)))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert CompactTokenizer.load(tmp_path / "tokenizer.json") is None
    assert isinstance(TextTokenizer.from_folder(tmp_path).backend, Tokenizer)


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_damaged_file_is_refused(pair, tmp_path, cut):
    _, _, folder = pair
    text = (folder / "tokenizer.json").read_bytes()
    (tmp_path / "tokenizer.json").write_bytes(text[: int(len(text) * cut)])
    assert CompactTokenizer.load(tmp_path / "tokenizer.json") is None
    assert CompactTokenizer.load(tmp_path / "missing.json") is None


def test_merges_written_as_strings_read_as_pairs(pair, tmp_path):
    """The older "left right" form of a merge, as the tokenizers library reads it."""
    theirs, _, folder = pair
    layout = json.loads((folder / "tokenizer.json").read_text())
    layout["model"]["merges"] = [" ".join(merge) for merge in layout["model"]["merges"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(layout))
    ours = CompactTokenizer.load(tmp_path / "tokenizer.json")
    for text in ["abcde cde", "  aaaa ab", "é e dé"]:
        assert ours.encode(text).ids == theirs.encode(text).ids


def test_without_a_compiler_the_tokenizers_library_reads_it(pair, tmp_path, monkeypatch, caplog):
    theirs, _, folder = pair
    shutil.copy(folder / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    monkeypatch.setenv("CC", str(tmp_path / "no-compiler"))
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(text_tokenizer, "plain_library", build.plain_library.__wrapped__)
    tokenizer = TextTokenizer.from_folder(tmp_path)
    assert "could not build or load bpe " in caplog.text
    assert isinstance(tokenizer.backend, Tokenizer)
    assert tokenizer.encode("ab cd") == theirs.encode("ab cd").ids
