"""Shared fixtures: a tiny random Llama for fast tests, the real default model for slow ones.

The tiny models carry a small byte-level BPE tokenizer trained here on a fixed text, so
the fast tests need no real model at all. Only tests marked slow may ask for
``real_model_dir``: the default model converted from its GGUF once, into a per-user cache
(``PAGEDCHAT_CACHE_DIR``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler once, when first imported, and transformers'
    # modeling code imports it: set the interpreter before any test module is collected.
    os.environ.setdefault("TRITON_INTERPRET", "1")


TOKENIZER_TEXT = """\
You are a helpful, concise assistant running in a terminal. Answer in plain language, use
Markdown for lists and code, and say when you are not sure. Keep answers short unless the
user asks for detail. A user writes a message, a question or a word; the assistant writes
the reply. The system prompt comes first, then the newest messages that fit the window.
The quick brown fox jumps over the lazy dog; tell me a story about a trip to Oslo.
Once upon a time there was a model that read every token of the history again and again,
until the engine kept the keys and values of each sequence in blocks of a shared pool.
How do I square the numbers 0 to 9 in Python? Use a list comprehension: [n * n for n in x].
What is the capital of France? Paris. Remember me, and cut me short; go on, and now stop.
Hello, are you there? Yes: I am here, and this is the first, second and third answer.
Count with me: one two three four five six seven eight nine ten eleven twelve.
Naïve café, crème brûlée, 東京, Ελλάδα, 😀 — the bytes of other scripts decode whole.
"""
VOCAB_SIZE = 49152  # SmolLM2's: tests pick prompt token ids anywhere below it
SMALL_VOCAB_SIZE = 2048  # the test GGUFs': their prompts pick ids below 2000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE trained on ``TOKENIZER_TEXT`` with a ChatML template, laid out as
    SmolLM2's (bos ``<|im_start|>``, eos and pad ``<|im_end|>``, ``vocab_size`` ids);
    training is deterministic, so every session builds the same vocabulary.

    The vocabulary is filled up to ``vocab_size`` with plain tokens no merge produces:
    encoding never yields them, but every id a test or the random model picks decodes."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(TOKENIZER_TEXT.splitlines(), trainer)
    layout = json.loads(bpe.to_str())
    vocab = layout["model"]["vocab"]
    fillers = (f"tok{i}" for i in range(vocab_size))
    while len(vocab) < vocab_size:
        vocab.setdefault(next(fillers), len(vocab))
    bpe = Tokenizer.from_str(json.dumps(layout))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>", chat_template=CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tokenizer of the tiny models, without a model."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def small_tokenizer_gguf(tmp_path_factory) -> Path:
    """A GGUF holding only the tiny tokenizer, at ``SMALL_VOCAB_SIZE`` ids: the tokenizer
    the writers of test GGUFs copy where a test needs no real vocabulary (every reader of a
    GGUF parses its vocabulary, token by token)."""
    from tests.gguf_tokenizer import write_tokenizer_gguf

    folder = tmp_path_factory.mktemp("small-tokenizer")
    build_tiny_tokenizer(SMALL_VOCAB_SIZE).save_pretrained(folder)
    return write_tokenizer_gguf(folder, folder / "tokenizer.gguf")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The default SmolLM2-135M-Instruct, converted from its GGUF to an HF folder."""
    from pagedchat.engine.loading.loader import prepare_model

    return prepare_model(None).folder


@pytest.fixture(scope="session")
def real_hf_model(real_model_dir):
    """transformers' float32 model of the default model, loaded once for every slow test
    that compares the engine with it (nothing changes its weights)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def _built_models() -> dict:
    return {}


@pytest.fixture
def shared_model_loads(monkeypatch, _built_models):
    """Engines of a test that asks for this reuse the model a previous one loaded with the
    same config, dtype, device and kernels (one process, no tensor parallelism):
    each gets its own KV pool, and the shared model's layers are pointed at the newest
    pool, so an engine built earlier must not be stepped again. For the real models, whose
    weights no test changes."""
    from pagedchat.engine.runner import model_runner

    build = model_runner.build_model

    def cached(model_config, kernels, tp, device, dtype):
        if tp.size > 1:
            return build(model_config, kernels, tp, device, dtype)
        key = (repr(model_config), kernels.__name__, str(device), dtype)
        if key not in _built_models:
            _built_models[key] = build(model_config, kernels, tp, device, dtype)
        return _built_models[key]

    monkeypatch.setattr(model_runner, "build_model", cached)


@contextmanager
def on_threads(threads: int) -> Iterator[None]:
    """torch's thread count, which the C kernels read, set to ``threads`` inside and restored
    after, whatever the process runs on (the suite's xdist workers run on one thread each)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _small_default_kv_pool(monkeypatch):
    """An engine built without a pool size (the commands' default) gets a pool of a few
    hundred MiB rather than the default's GiBs: a test's requests fill a small share of
    either, and the block manager keeps an entry per block of the pool. Tensor-parallel workers,
    spawned processes, keep the real default; rank 0's pool is the one scheduled."""
    from pagedchat.engine.config import EngineConfig

    monkeypatch.setattr(EngineConfig, "DEFAULT_KV_CACHE_MEMORY", "256MiB")


_PREBUILD = pytest.StashKey[tuple[subprocess.Popen, Path]]()


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker gets one core: two workers with a team of OpenMP threads
    each would take turns on the same cores, every team's spinning threads slowing the
    other's. Subprocesses a test starts inherit the limit; tests of the threaded kernel
    paths set their thread count themselves."""
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the kernel levels the tests switch to (tests/prebuild_kernels.py) beside the
    tests, at the lowest priority, rather than in the first test that asks for each (once,
    in the process that runs or hands out the tests)."""
    if hasattr(session.config, "workerinput"):
        return
    from pagedchat.paths import cache_root

    kernels = cache_root() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(dir=kernels, prefix=".prebuild-"))
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.prebuild_kernels", str(kernels)],
        cwd=Path(__file__).parents[1],
        env={**os.environ, "PAGEDCHAT_CACHE_DIR": str(private), "TMPDIR": str(private)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    session.config.stash[_PREBUILD] = (process, private)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _PREBUILD not in session.config.stash:
        return
    process, private = session.config.stash[_PREBUILD]
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    shutil.rmtree(private, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The fast suite must run where the real model is absent: a test that asks for
    ``real_model_dir`` without the slow mark fails before anything converts."""
    if "real_model_dir" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "slow"):
        pytest.fail("real_model_dir loads the real model: mark the test @pytest.mark.slow")


def save_tiny_llama(folder: Path, rope_parameters: dict | None = None,
                    vocab_size: int = VOCAB_SIZE, **shape) -> Path:
    """A 2-layer random Llama with the tiny tokenizer (at ``vocab_size`` ids), saved as an
    HF folder.

    Weights are drawn with a wide init so that its next-token distributions are
    peaked (a near-uniform random model would make every greedy step a near-tie)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer), num_hidden_layers=2, max_position_embeddings=1024,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """4 query heads, 2 KV heads: the model of the fast tests."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama"), hidden_size=64,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="session")
def small_vocab_model_dir(tmp_path_factory) -> Path:
    """The tiny Llama's shape at ``SMALL_VOCAB_SIZE`` ids: the source of test GGUFs, whose
    readers parse the vocabulary token by token."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama-small-vocab"), vocab_size=SMALL_VOCAB_SIZE,
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16)


@pytest.fixture(scope="session")
def tiny_tp_model_dir(tmp_path_factory) -> Path:
    """8 query heads, 4 KV heads: splits over 1, 2 or 4 tensor-parallel workers."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama-tp"), hidden_size=128,
        intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=16)


@pytest.fixture(scope="session")
def tiny_hf_model(tiny_model_dir: Path):
    """transformers' float32 model of the tiny Llama, shared by the tests that compare with
    its ``generate``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir: Path):
    """One engine on the tiny model, shared by tests that only submit requests."""
    from pagedchat import LLM

    return LLM(model=str(tiny_model_dir), num_kv_blocks=256, block_size=16)


@pytest.fixture(scope="session")
def make_tiny_llama(tmp_path_factory):
    """Build another tiny Llama: ``make_tiny_llama(name, rope_parameters=..., **shape)``."""
    def make(name: str, rope_parameters: dict | None = None, **shape) -> Path:
        shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, **shape}
        return save_tiny_llama(tmp_path_factory.mktemp(name), rope_parameters, **shape)
    return make


@pytest.fixture
def small_copy_bandwidth(monkeypatch):
    """The bench commands' copy-bandwidth figure taken on a small buffer: the tests check
    how the figure is used, and ``copy_bandwidth`` itself is tested in tests/bench."""
    from functools import partial

    from pagedchat_lab import bandwidth

    monkeypatch.setattr(bandwidth, "copy_bandwidth",
                        partial(bandwidth.copy_bandwidth, size=1 << 24, repeats=2))
