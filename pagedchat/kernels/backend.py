"""The contract every kernel backend module keeps (reference, cpu, triton): one Protocol,
which the modules are checked against (tests/kernels/test_backend_contract.py). The
reference module's functions say what each operation computes; a backend may add to it
(the CPU one offers ``decoder_stack`` and ``LayerTensors``), never change it."""

from __future__ import annotations

from typing import Protocol

import torch

from pagedchat.kernels.quant import QuantizedWeight


class KernelBackend(Protocol):
    """The operations the model and the engine call, with their signatures."""

    def prepare(self) -> None:
        """Begin, without waiting, what the first operation would otherwise wait for (the CPU
        backend compiles its kernels on a first start); operations called meanwhile wait for it."""

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None: ...

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor,
                        context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, *, max_query_len: int | None = None,
                        max_context_len: int | None = None,
                        window: int | None = None) -> torch.Tensor: ...

    def copy_blocks(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                    block_mapping: torch.Tensor) -> None: ...

    def swap_blocks(self, src: torch.Tensor, dst: torch.Tensor,
                    block_mapping: torch.Tensor) -> None: ...

    def max_logsumexp(
        self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def screen_candidates(self, approx: torch.Tensor, norms: torch.Tensor, slack: torch.Tensor,
                          capacity: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rotary_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     num_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot_mapping: torch.Tensor) -> torch.Tensor: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor: ...

    def pack_linear(self, weight: torch.Tensor) -> torch.Tensor: ...

    def embedding(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...

    def pack_embedding(self, weight: torch.Tensor) -> torch.Tensor: ...

    def quantized_linear(self, x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None = None,
                         out: torch.Tensor | None = None) -> torch.Tensor: ...

    def quantized_embedding(self, ids: torch.Tensor, weight: QuantizedWeight,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor: ...


def operations() -> list[str]:
    """The names :class:`KernelBackend` requires, in its order."""
    return [name for name in vars(KernelBackend) if not name.startswith("_")]
