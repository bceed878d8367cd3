"""Layer groups: every page the same size, each group a set of same-kind layers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pagedchat.engine.kv_groups import LOCAL, kv_groups
from pagedchat.engine.model_config import ModelConfig


def config(layer_types: list[str], window: int | None = 512) -> ModelConfig:
    return ModelConfig(Path("."), "gemma3_text", 100, 64, 128, len(layer_types), 4, 1, 256,
                       {"rope_type": "default", "rope_theta": 1e6}, False,
                       layer_types=tuple(layer_types), sliding_window=window)


def pattern(num_layers: int, every: int = 6) -> list[str]:
    return [("full_attention" if (i + 1) % every == 0 else LOCAL) for i in range(num_layers)]


@pytest.mark.parametrize("num_layers, per_page, num_global, num_local", [
    (18, 3, 1, 5),  # Gemma 3 270M: 3 global, 15 local layers
    (26, 2, 2, 11),  # Gemma 3 1B: 4 global, 22 local
    (4, 4, 0, 1),  # only local layers: one group of all of them
])
def test_groups_of_equal_size_per_kind(num_layers, per_page, num_global, num_local):
    groups = kv_groups(config(pattern(num_layers)))
    assert groups.layers_per_page == per_page
    assert groups.windows.count(None) == num_global
    assert groups.windows.count(512) == num_local
    sizes = Counter(groups.layer_group)
    assert set(sizes.values()) == {per_page}
    for layer, (group, slot) in enumerate(zip(groups.layer_group, groups.layer_slot,
                                              strict=True)):
        assert (groups.windows[group] is not None) == (pattern(num_layers)[layer] == LOCAL)
        assert 0 <= slot < per_page
    # within a group each layer has a slot of its own
    assert len(set(zip(groups.layer_group, groups.layer_slot, strict=True))) == num_layers


def test_a_model_without_windows_has_one_group_of_every_layer():
    groups = kv_groups(config(["full_attention"] * 5, window=None))
    assert groups.windows == (None,)
    assert groups.layer_group == (0,) * 5 and groups.layer_slot == tuple(range(5))
    assert groups.layers_per_page == 5
