"""How a model's layers share the KV pool: layer groups, each with its own block tables.

A Llama-family model has one group: a physical block (a page) holds one block of tokens for
every layer, as in the paper. A model with sliding-window layers (Gemma 3) frees a local
layer's blocks once they slide out of its window while a global layer's stay, so each kind
needs tables of its own. Every page has the same size, so any free page serves any group: a
page holds ``layers_per_page`` layers (the greatest common divisor of the two kinds' layer
counts), each kind is split into groups of that many layers, and groups of one kind fill
and free their tables in lockstep. The pool is one tensor per page slot; a layer keeps its
K/V in its slot's tensor, at the pages its group's table names."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedchat.engine.model_config import ModelConfig

LOCAL = "sliding_attention"


@dataclass(frozen=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: its sliding window, None for global
    layer_group: tuple[int, ...]  # per layer: the group whose tables it reads
    layer_slot: tuple[int, ...]  # per layer: its slot within a page
    layers_per_page: int

    @property
    def num_groups(self) -> int:
        return len(self.windows)


def kv_groups(config: ModelConfig) -> KVGroups:
    """The layer groups of ``config``: one for a model without sliding-window layers."""
    num_layers = config.num_hidden_layers
    local = [kind == LOCAL for kind in config.layer_types] if config.sliding_window else []
    if not any(local):
        return KVGroups((None,), (0,) * num_layers, tuple(range(num_layers)), num_layers)
    kinds = {False: [i for i, is_local in enumerate(local) if not is_local],
             True: [i for i, is_local in enumerate(local) if is_local]}
    per_page = math.gcd(len(kinds[False]), len(kinds[True]))
    windows: list[int | None] = []
    layer_group = [0] * num_layers
    layer_slot = [0] * num_layers
    for is_local, layers in kinds.items():
        first = len(windows)
        windows += [config.sliding_window if is_local else None] * (len(layers) // per_page)
        for j, layer in enumerate(layers):
            layer_group[layer] = first + j // per_page
            layer_slot[layer] = j % per_page
    return KVGroups(tuple(windows), tuple(layer_group), tuple(layer_slot), per_page)


def max_blocks(windows: tuple[int | None, ...], block_size: int, num_tokens: int,
               chunk: int) -> int:
    """The most blocks one sequence of ``num_tokens`` tokens holds at once over every group,
    computing at most ``chunk`` tokens a step: a windowed group holds its window and one
    chunk, a global group every token."""
    full = -(-num_tokens // block_size)
    return sum(full if window is None else min(full, -(-(window - 1 + chunk) // block_size) + 1)
               for window in windows)
