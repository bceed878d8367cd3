"""What the engine asks of its runner: one process (``runner/model_runner.py``) or a
tensor-parallel group seen from rank 0 (``parallel/parallel_runner.py``) alike; and the
StepTimer every runner keeps: where a step's time goes, cheap enough to stay on."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Protocol, runtime_checkable

import torch

from pagedchat.engine.kv_groups import KVGroups
from pagedchat.engine.step_input import StepInput, StepOutput


class StepTimer:
    """Adds up seconds per named phase (``schedule``, ``prepare``, ``forward``...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()
        self.steps = 0

    def shares(self) -> dict[str, float]:
        """Each phase's fraction of the total time recorded."""
        total = sum(self.seconds.values())
        return {name: value / total for name, value in self.seconds.items()} if total else {}


@runtime_checkable
class Runner(Protocol):
    num_blocks: int  # the device KV pool, in blocks (every layer group draws on it)
    num_host_blocks: int  # the host swap pool, in blocks
    kv_groups: KVGroups  # the model's layer groups: one block table each
    kv_dtype: torch.dtype  # the pool's element type in force
    kernels: ModuleType  # the kernel backend (the engine's sampler reduces with it)
    timer: StepTimer  # wall time per phase of a step

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of the pool (this process's heads)."""
        ...

    @property
    def weight_bytes(self) -> int:
        """Bytes of this process's weights."""
        ...

    def execute(self, step: StepInput) -> StepOutput | None:
        """Run one step. The engine's runner (rank 0) always returns its StepOutput; None
        comes back only on a tensor-parallel worker of another rank."""
        ...

    def communication(self) -> dict[str, int]:
        """Tokens and steps run, bytes all-reduced and broadcast (zero in one process)."""
        ...

    def shutdown(self) -> None:
        """Release what the runner holds beyond memory (worker processes); safe to repeat."""
        ...
