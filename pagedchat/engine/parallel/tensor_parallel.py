"""Tensor parallelism, Megatron style (paper section 4.6): what one worker holds and the
two collectives a step needs.

Each of the ``size`` workers holds its share of every layer's attention heads (and of every
KV block, for those heads), MLP intermediate columns and vocabulary. Column-parallel layers
(fused QKV, gate/up) need no communication; row-parallel ones (attention output, MLP down)
and the vocabulary-parallel embedding end with an all-reduce. The sampled rows' logits are
gathered on rank 0, the only rank that samples."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from pagedchat.engine.model_config import ModelConfig

# How long a collective may wait for a peer. Dead workers are caught far sooner (the
# watchdog in parallel_runner.py); this only bounds a live worker that stopped answering
# (and a worker's wait for rank 0's store).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


def valid_sizes(model_config: ModelConfig) -> list[int]:
    """Every tensor-parallel size that splits the model's heads and MLP evenly."""
    common = math.gcd(model_config.num_attention_heads, model_config.num_key_value_heads,
                      model_config.intermediate_size)
    return [k for k in range(1, common + 1) if common % k == 0]


def check_size(size: int, model_config: ModelConfig) -> None:
    """Refuse a size that does not divide the heads, naming the sizes that do."""
    from pagedchat.engine.errors import RequestError

    sizes = valid_sizes(model_config)
    if size not in sizes:
        raise RequestError(
            f"tensor_parallel_size={size} does not divide this model's "
            f"{model_config.num_attention_heads} attention heads, "
            f"{model_config.num_key_value_heads} KV heads and "
            f"{model_config.intermediate_size} MLP columns evenly; sizes that work: "
            f"{', '.join(map(str, sizes))}")


@dataclass
class TensorParallel:
    """One worker's place in the group. With ``size == 1`` every collective is a no-op,
    so the single-process engine runs the same model code."""

    rank: int = 0
    size: int = 1
    bytes_all_reduced: int = 0
    bytes_broadcast: int = 0
    group: Any = None  # the torch.distributed process group carrying activations
    control_group: Any = None  # the one carrying step messages (gloo, also on GPUs)

    def connect(self, store, device_type: str) -> None:
        """Join the group through ``store`` (a TCPStore rank 0 serves): this engine's own, not
        torch's global default, so engines in one process stay independent. Gloo on the CPU;
        on CUDA, NCCL for the activations and gloo for the step messages."""
        import torch.distributed as dist

        if device_type == "cuda":
            self.group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), self.rank,
                                               self.size)
            self.control_group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store),
                                                       self.rank, self.size, COLLECTIVE_TIMEOUT)
        else:
            self.group = dist.ProcessGroupGloo(store, self.rank, self.size, COLLECTIVE_TIMEOUT)
            self.control_group = self.group

    def close(self) -> None:
        """Leave the group (its connections close when the objects go)."""
        self.group = self.control_group = None

    def part(self, total: int) -> tuple[int, int]:
        """This rank's ``[start, end)`` of ``total`` items cut into ``size`` equal parts
        (the last part may be short, for a vocabulary that does not divide)."""
        step = -(-total // self.size)
        start = min(self.rank * step, total)
        return start, min(start + step, total)

    def shard(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's equal slice of ``tensor`` along ``dim`` (size divides it)."""
        length = tensor.shape[dim] // self.size
        return tensor.narrow(dim, self.rank * length, length)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place; counted in ``bytes_all_reduced``."""
        if self.size > 1:
            self.group.allreduce([tensor]).wait()
            self.bytes_all_reduced += tensor.numel() * tensor.element_size()
        return tensor

    def gather_columns(self, tensor: torch.Tensor, total: int) -> torch.Tensor | None:
        """Rank 0 gets every rank's column block side by side, cut to ``total`` columns;
        the other ranks get None. Blocks are padded to one width, as gather needs."""
        if self.size == 1:
            return tensor
        width = -(-total // self.size)
        if tensor.shape[1] < width:
            tensor = torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))
        tensor = tensor.contiguous()
        if self.rank != 0:
            self.group.gather([], [tensor]).wait()  # the root is rank 0 by default
            return None
        blocks = [torch.empty_like(tensor) for _ in range(self.size)]
        self.group.gather([blocks], [tensor]).wait()
        return torch.cat(blocks, dim=1)[:, :total]

    def broadcast(self, message: object = None) -> object:
        """Rank 0's ``message`` (any picklable object) on every rank: its length, then
        its bytes, over the control group (CPU tensors, so gloo carries it even on GPUs)."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self.control_group.broadcast([length]).wait()  # root is rank 0 by default
        if self.rank != 0:
            payload = torch.empty(int(length), dtype=torch.uint8)
        self.control_group.broadcast([payload]).wait()
        self.bytes_broadcast += payload.numel() + length.numel() * 8
        return message if self.rank == 0 else pickle.loads(payload.numpy().tobytes())
