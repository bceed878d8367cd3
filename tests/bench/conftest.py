"""A tiny random-weight GGUF shared by the bench tests that need a GGUF file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedchat_lab.synthetic_gguf import SHAPES, write_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, small_tokenizer_gguf) -> Path:
    """The writer's tiny shape in Q8_0, drawn wide (std 0.5) so that greedy steps are not
    near-ties, as the tiny HF model of the top conftest is; with the tiny tokenizer, as no
    bench test needs the real vocabulary."""
    path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    write_gguf(path, SHAPES["tiny"], small_tokenizer_gguf, "Q8_0", seed=3, std=0.5)
    return path
