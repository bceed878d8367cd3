"""Every backend module keeps the one contract, KernelBackend: each operation is there with
the Protocol's parameters (names, order, defaults), and any more only with defaults (the
Triton attention takes optional hints)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

from pagedchat.kernels import BACKENDS, backend

MODULES = {"torch": "pagedchat.kernels.reference", "cpu": "pagedchat.kernels.cpu",
           "triton": "pagedchat.kernels.triton_backend"}


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()
            if p.name != "self"]


def test_the_contract_names_every_operation():
    assert backend.operations() == [
        "prepare", "store_kv", "paged_attention", "copy_blocks", "swap_blocks", "max_logsumexp",
        "screen_candidates", "rms_norm", "rotary_store", "silu_mul", "gelu_tanh_mul", "linear",
        "pack_linear",
        "embedding", "pack_embedding", "quantized_linear", "quantized_embedding"]
    assert set(MODULES) == set(BACKENDS)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_backend_keeps_the_contract(name, monkeypatch):
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    module = importlib.import_module(MODULES[name])
    for operation in backend.operations():
        function = getattr(module, operation, None)
        assert callable(function), f"{name} has no {operation}"
        expected = parameters(getattr(backend.KernelBackend, operation))
        found = parameters(function)
        assert found[:len(expected)] == expected, \
            f"{name}.{operation} differs from KernelBackend.{operation}"
        assert all(default is not inspect.Parameter.empty
                   for _, default in found[len(expected):]), f"{name}.{operation}"
