"""A tiny random-weight GGUF shared by the bench tests that need a GGUF file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedchat.bench.synthetic_gguf import SHAPES, write_gguf
from pagedchat.engine.loading.loader import default_model_path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """The writer's tiny shape in Q8_0, drawn wide (std 0.5) so that greedy steps are not
    near-ties, as the tiny HF model of the top conftest is."""
    path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    write_gguf(path, SHAPES["tiny"], default_model_path(), "Q8_0", seed=3, std=0.5)
    return path
