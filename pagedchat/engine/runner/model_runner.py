"""Runs the model over the paged KV cache for one step and returns the sampled rows' logits.

The step arrives as a :class:`StepInput`, so the same runner serves the single-process engine
and every worker of a tensor-parallel group, each holding its share of the heads and blocks."""

from __future__ import annotations

import numpy as np
import torch

from pagedchat.engine.config import EngineConfig, parse_bytes
from pagedchat.engine.kv_groups import kv_groups
from pagedchat.engine.layers.attention import AttentionMetadata
from pagedchat.engine.loading.loader import load_weights
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.models import model_class
from pagedchat.engine.parallel.tensor_parallel import TensorParallel
from pagedchat.engine.runner.memory import (
    anonymous_tensor,
    hand_back_freed_memory,
    keep_freed_memory,
    to_host,
)
from pagedchat.engine.runner.protocol import StepTimer
from pagedchat.engine.step_input import KEPT_ROWS, StepInput, StepOutput
from pagedchat.kernels import select_backend
from pagedchat.kernels.kv_int8 import SCALE_BYTES
from pagedchat.kernels.quant import QuantizedWeight

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of a model built on the meta device uninitialised
    storage on ``device``: what ``Module.to_empty`` does, without its ``empty_like`` of
    meta tensors, which runs through torch's Python references and imports sympy."""
    for module in model.modules():
        for name, tensor in [*module.named_parameters(recurse=False),
                             *module.named_buffers(recurse=False)]:
            empty = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
            if isinstance(tensor, torch.nn.Parameter):
                empty = torch.nn.Parameter(empty, requires_grad=tensor.requires_grad)
            setattr(module, name, empty)


def kv_cache_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """The KV pools' element type: the activations' (``auto``) or int8, which every
    attention backend stores and reads."""
    return dtype if config.kv_cache_dtype == "auto" else torch.int8


def build_model(model_config: ModelConfig, kernels, tp: TensorParallel, device: torch.device,
                dtype: torch.dtype) -> torch.nn.Module:
    """The model with its weights loaded and laid out for the kernels, without KV caches."""
    # Built on the meta device: no time spent on random weights that are replaced.
    with torch.device("meta"):
        model = model_class(model_config)(model_config, kernels, tp)
    materialize(model, device)
    with torch.device(device):
        model.build_rotary()
    model.load_hf_state_dict(load_weights(model_config))
    model = model.to(dtype).eval()
    model.pack()
    return model


class ModelRunner:
    def __init__(
        self, config: EngineConfig, model_config: ModelConfig, tp: TensorParallel | None = None
    ) -> None:
        self.config = config
        self.tp = tp or TensorParallel()
        self.timer = StepTimer()
        self.device = torch.device(resolve_device(config.device))
        if self.device.type == "cuda" and self.tp.size > 1:
            self.device = torch.device("cuda", self.tp.rank)  # one GPU per worker
            torch.cuda.set_device(self.device)
        if self.device.type == "cpu":
            hand_back_freed_memory()
        self.dtype = DTYPES[config.dtype]
        self.kernels = select_backend(self.device.type, config.attention_backend)
        self.kernels.prepare()  # a first start's compile, while the weights load
        self.kv_dtype = kv_cache_dtype(config, self.dtype)
        self.block_size = config.block_size
        self.model = build_model(model_config, self.kernels, self.tp, self.device, self.dtype)
        attn = self.model.layers[0].self_attn
        int8 = self.kv_dtype == torch.int8
        self.kv_shape = (self.block_size, attn.num_kv_heads,
                         attn.head_dim + (SCALE_BYTES if int8 else 0))
        self.kv_groups = kv_groups(model_config)
        self.num_blocks = self._num_blocks()
        self.num_host_blocks = parse_bytes(config.swap_space) // self.block_bytes
        # one K and one V tensor per slot of a page: a layer's K/V live in its slot's tensors
        self.k_caches, self.v_caches = self._allocate(self.num_blocks, self.device)
        # the host pool, used only when swapping, is left to fill as blocks are swapped out
        self.host_k_caches, self.host_v_caches = self._allocate(self.num_host_blocks, "cpu")
        for layer, slot in zip(self.model.layers, self.kv_groups.layer_slot, strict=True):
            layer.self_attn.k_cache = self.k_caches[slot]
            layer.self_attn.v_cache = self.v_caches[slot]
        self.tokens_forwarded = self.steps_run = 0
        self._logits: torch.Tensor | None = None  # see _logits_buffer
        # final hidden states of prompts' last rows, one per slot (StepInput.keep)
        self.kept = torch.zeros(KEPT_ROWS, model_config.hidden_size, dtype=self.dtype,
                                device=self.device)
        if self.device.type == "cpu":
            keep_freed_memory()

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V for one block of the pool (this worker's heads): one block of
        tokens for each of its group's layers (every layer, with one group)."""
        per_layer = 2 * int(np.prod(self.kv_shape)) * self.kv_dtype.itemsize
        return per_layer * self.kv_groups.layers_per_page

    @property
    def weight_bytes(self) -> int:
        """Bytes of this worker's weights (the whole model when there is one worker), those
        kept quantized as their blocks."""
        plain = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return plain + sum(weight.nbytes for weight in self._quantized_weights())

    def _quantized_weights(self) -> list[QuantizedWeight]:
        """The weights kept in GGML blocks, each once (a tied head shares its embedding's)."""
        found = {id(m.quantized): m.quantized for m in self.model.modules()
                 if isinstance(getattr(m, "quantized", None), QuantizedWeight)}
        return list(found.values())

    def communication(self) -> dict[str, int]:
        """Tokens run so far and the bytes exchanged for them (zero with one worker)."""
        return {"tokens": self.tokens_forwarded, "steps": self.steps_run,
                "bytes_all_reduced": self.tp.bytes_all_reduced,
                "bytes_broadcast": self.tp.bytes_broadcast}

    def _num_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        budget = parse_bytes(self.config.kv_cache_memory or EngineConfig.DEFAULT_KV_CACHE_MEMORY)
        return max(budget // self.block_bytes, 1)

    def _allocate(self, num_blocks: int, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V pools, views of one zeroed allocation; on the CPU the system's
        zero pages, each touched when a block on it is first written: a start costs nothing
        per block of the pool, and the resident set grows with the blocks used (handed out
        lowest first), not with the pool's size."""
        shape = (2 * self.kv_groups.layers_per_page, num_blocks, *self.kv_shape)
        pool = (anonymous_tensor(shape, self.kv_dtype) if torch.device(device).type == "cpu"
                else torch.zeros(shape, dtype=self.kv_dtype, device=device))
        return list(pool[0::2]), list(pool[1::2])

    def shutdown(self) -> None:
        """Nothing to release in one process (the parallel runner stops its workers)."""

    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepOutput | None:
        """Run one step; rank 0 gets the sampled rows' logits and greedy tokens (see StepOutput),
        other workers None. A step without query rows (only kept rows are sampled) runs no layer."""
        self.tokens_forwarded += len(step.input_ids)
        self.steps_run += 1
        with self.timer.phase("prepare"):
            self._move_blocks(step)
            tensors = self._to_tensors(step) if len(step.input_ids) else None
        if tensors is None:
            hidden = self.kept[:0]
        else:
            input_ids, positions, metas = tensors
            with self.timer.phase("forward"):
                hidden = (self.model(input_ids, positions, metas[0]) if len(metas) == 1
                          else self.model(input_ids, positions, metas[0], metas))
        with self.timer.phase("logits"):
            return self._sample_outputs(hidden, step)

    def _sample_outputs(self, hidden: torch.Tensor, step: StepInput) -> StepOutput | None:
        """The argmax rows' tokens, then the other sampled rows' logits (both use the logits
        buffer, whose logits outlive the step), on every worker; the step's keeps kept."""
        source, rows = self._sampled_hidden(hidden, step)
        if step.keep:
            slots = torch.tensor([slot for _, slot in step.keep], dtype=torch.int64,
                                 device=self.device)
            picked = [step.sample_rows[i] for i, _ in step.keep]
            self.kept.index_copy_(0, slots, self._rows(hidden, picked))
        # no token comes of a sampled row that is not finite: its request fails, the others
        # go on (on every worker alike, the row zeroed, so that the head's path is the same)
        finite = torch.isfinite(self._rows(source, rows)).all(dim=-1)
        if failed := (~finite).nonzero().flatten().tolist():
            source = source.index_fill(0, torch.tensor([rows[i] for i in failed],
                                                       device=self.device), 0.0)
        argmax = set(step.argmax_rows)
        greedy = [rows[i] for i in step.argmax_rows]
        wanted = [row for i, row in enumerate(rows) if i not in argmax]
        tokens = torch.empty(0, dtype=torch.int64)
        if greedy:
            tokens = self.model.greedy_tokens(self._rows(source, greedy),
                                              self._logits_buffer(len(greedy)))
        logits = torch.empty(0, self.model.config.vocab_size)
        if wanted:
            logits = self.model.compute_logits(self._rows(source, wanted),
                                               self._logits_buffer(len(wanted)))
        return StepOutput(to_host(logits), tokens.tolist(), failed) if self.tp.rank == 0 else None

    def _sampled_hidden(self, hidden: torch.Tensor,
                        step: StepInput) -> tuple[torch.Tensor, list[int]]:
        """What the sampled rows are read from, and their rows in it: the step's hidden
        states, or where some are kept rows, the computed sampled rows followed by every
        kept slot (a copy, so that this step's keeps may then overwrite slots)."""
        if not step.from_kept:
            return hidden, step.sample_rows
        computed = [row for row in step.sample_rows if row >= 0]
        source = torch.cat([self._rows(hidden, computed), self.kept])
        kept = dict(step.from_kept)
        rows, index = [], 0
        for i, row in enumerate(step.sample_rows):
            if row < 0:
                rows.append(len(computed) + kept[i])
            else:
                rows.append(index)
                index += 1
        return source, rows

    def _rows(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return hidden.index_select(0, torch.tensor(rows, dtype=torch.int64, device=self.device))

    def _logits_buffer(self, rows: int) -> torch.Tensor:
        """Where this step's logits go (valid until the next step): the first ``rows`` rows
        of a buffer kept from step to step, grown to the next power of two of rows, in a
        mapping of its own: allocated per step, it made the heap creep from run to run."""
        if self._logits is None or self._logits.shape[0] < rows:
            shape = (1 << (rows - 1).bit_length(), self.model.vocab_rows)
            self._logits = None  # the old one goes before the new one is mapped
            self._logits = (anonymous_tensor(shape, self.dtype) if self.device.type == "cpu"
                            else torch.empty(shape, dtype=self.dtype, device=self.device))
        return self._logits[:rows]

    def _move_blocks(self, step: StepInput) -> None:
        """Swap out, swap in, then copy-on-write: before the step writes anything."""
        swap = self.kernels.swap_blocks
        for pairs, src, dst in (
            (step.swap_out, (self.k_caches, self.v_caches),
             (self.host_k_caches, self.host_v_caches)),
            (step.swap_in, (self.host_k_caches, self.host_v_caches),
             (self.k_caches, self.v_caches))):
            if pairs:
                mapping = torch.tensor(pairs, dtype=torch.int64)
                for s, d in zip(src[0] + src[1], dst[0] + dst[1]):
                    swap(s, d, mapping)
        if step.copies:
            mapping = torch.tensor(step.copies, dtype=torch.int64, device=self.device)
            self.kernels.copy_blocks(self.k_caches, self.v_caches, mapping)

    def _to_tensors(self, step: StepInput):
        """The step's tensors and one AttentionMetadata per layer group."""
        device = self.device
        query_lens = np.diff(step.query_start_loc)
        slots = torch.from_numpy(step.slot_mapping).to(device)
        tables = torch.from_numpy(step.block_tables).to(device)
        context_lens = torch.from_numpy(step.context_lens).to(device)
        query_start = torch.from_numpy(step.query_start_loc).to(device)
        metas = [AttentionMetadata(
            slot_mapping=slots[group], block_tables=tables[group], context_lens=context_lens,
            query_start_loc=query_start, max_query_len=int(query_lens.max()),
            max_context_len=int(step.context_lens.max()),
        ) for group in range(self.kv_groups.num_groups)]
        input_ids = torch.from_numpy(step.input_ids).to(device)
        return input_ids, torch.from_numpy(step.positions).to(device), metas
