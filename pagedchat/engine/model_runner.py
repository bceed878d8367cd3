"""Builds one step's flat batch, runs the model over the paged KV cache, returns logits.

The batch is every scheduled token of every sequence, one after another: prefill
chunks and single decode tokens side by side. For each token it computes its
position and its cache slot (``block_table[pos // block_size] * block_size +
pos % block_size``); for each sequence its context length and padded block table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from pagedchat.engine.config import EngineConfig, parse_bytes
from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.models.llama import AttentionMetadata, LlamaForCausalLM
from pagedchat.engine.profiling import StepTimer
from pagedchat.engine.scheduler import SchedulerOutput
from pagedchat.kernels import select_backend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class ModelRunner:
    def __init__(self, config: EngineConfig, hf_config, folder: Path) -> None:
        self.config = config
        self.timer = StepTimer()
        self.device = torch.device(resolve_device(config.device))
        self.dtype = DTYPES[config.dtype]
        self.kernels = select_backend(self.device.type, config.attention_backend)
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        # Built on the meta device: no time spent on random weights that are replaced.
        with torch.device("meta"):
            model = LlamaForCausalLM(hf_config, self.kernels, self.max_model_len)
        model.to_empty(device=self.device)
        with torch.device(self.device):
            model.build_rotary(self.max_model_len)
        model.load_hf_state_dict(_read_weights(folder))
        self.model = model.to(self.dtype).eval()
        self.model.rotary.float()
        attn = self.model.layers[0].self_attn
        self.kv_shape = (self.block_size, attn.num_kv_heads, attn.head_dim)
        self.num_blocks = self._num_blocks()
        self.num_host_blocks = parse_bytes(config.swap_space) // self.block_bytes
        self.k_caches, self.v_caches = self._allocate(self.num_blocks, self.device)
        self.host_k_caches, self.host_v_caches = self._allocate(self.num_host_blocks, "cpu")
        for layer, k, v in zip(self.model.layers, self.k_caches, self.v_caches):
            layer.self_attn.k_cache, layer.self_attn.v_cache = k, v

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V for one block across all layers."""
        per_layer = 2 * int(np.prod(self.kv_shape)) * torch.finfo(self.dtype).bits // 8
        return per_layer * len(self.model.layers)

    def _num_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        budget = parse_bytes(self.config.kv_cache_memory or EngineConfig.DEFAULT_KV_CACHE_MEMORY)
        return max(budget // self.block_bytes, 1)

    def _allocate(self, num_blocks: int, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V pools. Left uninitialised: every kernel reads only slots
        already written, so untouched pages cost neither start-up time nor memory."""
        shape = (num_blocks, *self.kv_shape)
        layers = range(len(self.model.layers))
        keys = [torch.empty(shape, dtype=self.dtype, device=device) for _ in layers]
        values = [torch.empty(shape, dtype=self.dtype, device=device) for _ in layers]
        return keys, values

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Run one step; logits ``[num_sampling_seqs, vocab]`` in scheduled order."""
        with self.timer.phase("prepare"):
            self._move_blocks(out)
            input_ids, positions, meta, sample_rows = self._prepare(out)
        with self.timer.phase("forward"):
            hidden = self.model(input_ids, positions, meta)
        if not sample_rows:
            return torch.empty(0, self.model.config.vocab_size)
        with self.timer.phase("logits"):
            rows = torch.tensor(sample_rows, device=self.device)
            return self.model.compute_logits(hidden.index_select(0, rows)).cpu()

    def _move_blocks(self, out: SchedulerOutput) -> None:
        """Swap out, swap in, then copy-on-write: before the step writes anything."""
        swap = self.kernels.swap_blocks
        for pairs, src, dst in (
            (out.swap_out, (self.k_caches, self.v_caches),
             (self.host_k_caches, self.host_v_caches)),
            (out.swap_in, (self.host_k_caches, self.host_v_caches),
             (self.k_caches, self.v_caches)),
        ):
            if pairs:
                mapping = torch.tensor(pairs, dtype=torch.int64)
                for s, d in zip(src[0] + src[1], dst[0] + dst[1]):
                    swap(s, d, mapping)
        if out.copies:
            mapping = torch.tensor(out.copies, dtype=torch.int64, device=self.device)
            self.kernels.copy_blocks(self.k_caches, self.v_caches, mapping)

    def _prepare(self, out: SchedulerOutput):
        bs = self.block_size
        token_chunks, position_chunks, slot_chunks = [], [], []
        context_lens, query_start, sample_rows = [], [0], []
        max_blocks = max(len(item.seq.block_table) for item in out.scheduled)
        tables = np.full((len(out.scheduled), max_blocks), -1, dtype=np.int32)
        for i, item in enumerate(out.scheduled):
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            table = np.asarray(seq.block_table, dtype=np.int64)
            tables[i, : len(table)] = table
            positions = np.arange(start, end)
            token_chunks.append(seq.token_ids[start:end])
            position_chunks.append(positions)
            slot_chunks.append(table[positions // bs] * bs + positions % bs)
            context_lens.append(end)
            query_start.append(query_start[-1] + item.num_new_tokens)
            if item.samples:
                sample_rows.append(query_start[-1] - 1)
        device = self.device
        input_ids = torch.tensor(
            [t for chunk in token_chunks for t in chunk], dtype=torch.int64, device=device)
        positions = torch.from_numpy(np.concatenate(position_chunks)).to(device)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(np.concatenate(slot_chunks)).to(device),
            block_tables=torch.from_numpy(tables).to(device),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
            max_query_len=max(item.num_new_tokens for item in out.scheduled),
            max_context_len=max(context_lens),
        )
        return input_ids, positions, meta, sample_rows


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / name for name in names]
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(path))
        except Exception as error:
            raise ModelLoadError(f"{path}: cannot read weights ({error})") from error
    return tensors
