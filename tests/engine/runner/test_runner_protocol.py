"""Both runners keep the engine's Runner contract: the one-process ModelRunner and the
tensor-parallel group's rank 0, ParallelRunner (its live instance is checked in
tests/engine/parallel/test_tensor_parallel.py)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from pagedchat.engine.parallel.parallel_runner import ParallelRunner
from pagedchat.engine.runner.model_runner import ModelRunner
from pagedchat.engine.runner.protocol import Runner

DATA = sorted(Runner.__annotations__)
CALLABLE = sorted(name for name, value in vars(Runner).items()
                  if not name.startswith("_") and (callable(value) or isinstance(value, property)))


def assigned_in_init(cls: type) -> set[str]:
    """The ``self.x`` names ``cls.__init__`` assigns (read from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    names = set()
    for node in ast.walk(tree):
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            for leaf in ast.walk(target) if target is not None else ():
                if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == "self"):
                    names.add(leaf.attr)
    return names


def test_the_protocol_names_what_the_engine_uses():
    assert DATA == ["kernels", "kv_dtype", "kv_groups", "num_blocks", "num_host_blocks", "timer"]
    assert CALLABLE == ["block_bytes", "communication", "execute", "shutdown", "weight_bytes"]


@pytest.mark.parametrize("cls", [ModelRunner, ParallelRunner], ids=lambda c: c.__name__)
def test_each_runner_keeps_the_protocol(cls):
    missing = set(DATA) - assigned_in_init(cls) - set(dir(cls))
    assert not missing, f"{cls.__name__} does not set {sorted(missing)}"
    for name in CALLABLE:
        expected, found = getattr(Runner, name), getattr(cls, name, None)
        assert found is not None, f"{cls.__name__} has no {name}"
        assert isinstance(found, property) == isinstance(expected, property), name
        if not isinstance(expected, property):
            assert list(inspect.signature(found).parameters) == list(
                inspect.signature(expected).parameters), f"{cls.__name__}.{name}"


def test_the_engine_runs_a_runner(tiny_llm):
    assert isinstance(tiny_llm.engine.runner, ModelRunner)
    assert isinstance(tiny_llm.engine.runner, Runner)
