"""KV blocks kept on disk, so that a conversation reopened after a restart starts warm.

When a request ends, the full blocks of its sequences are written one file per block, named
by the prefix cache's chain hash, under a folder named by the model's fingerprint (model
files' identity, weights mode, dtypes, block size, kernels). When a request arrives, the
blocks of its prompt the pool no longer caches are read back into free blocks as cached
ones, which the scheduler's prefix lookup then finds, so the prompt is not computed again.

A file carries its fingerprint, chain hash, parent hash, token ids and a checksum of its K/V:
one that does not match all of them is a miss, never a wrong answer; a corrupt or foreign
one is ignored with a log line (a corrupt one removed). Past the folder's size cap the least
recently used files go first."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import xxhash

from pagedchat.engine.blocks import HOLE, NO_HASH, block_hash
from pagedchat.paths import staged_file

if TYPE_CHECKING:
    from pagedchat.engine.config import EngineConfig
    from pagedchat.engine.loading.loader import ModelFiles
    from pagedchat.engine.runner.model_runner import ModelRunner
    from pagedchat.engine.scheduler import Scheduler
    from pagedchat.engine.sequence import SequenceGroup


class Engine(Protocol):
    """What the store reads of its engine (an ``LLMEngine``, whose module imports this one)."""

    config: EngineConfig
    model_files: ModelFiles
    scheduler: Scheduler
    runner: ModelRunner

log = logging.getLogger(__name__)

MAGIC = b"PCKV1\n"
SUFFIX = ".kv"
_HEADER = struct.Struct("<I")  # the JSON header's length


def fingerprint(engine: Engine) -> str:
    """What K/V computed by ``engine`` depend on, as a short hex digest: another model
    file, weights mode, dtype, K/V dtype, block size or kernel level is another store."""
    files, config, runner = engine.model_files, engine.config, engine.runner
    paths = [files.gguf] if files.gguf is not None else sorted(
        p for p in files.folder.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    identity = [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
    kernels = "gpu"
    if runner.device.type == "cpu":
        from pagedchat.kernels.cpu.build import isa

        kernels = isa()
    record = {"model": identity, "weights": config.weights, "dtype": config.dtype,
              "kv_dtype": str(runner.kv_dtype), "block_size": config.block_size,
              "device": runner.device.type, "kernels": kernels,
              "kv_shape": list(runner.kv_shape), "slots": len(runner.k_caches)}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


class KVStore:
    """The blocks of one engine's pool on disk (see the module's docstring)."""

    def __init__(self, engine: Engine, folder: str | os.PathLike, cap_bytes: int) -> None:
        self.block_manager = engine.scheduler.block_manager
        self.runner = engine.runner
        self.root = Path(folder)
        self.fingerprint = fingerprint(engine)
        self.folder = self.root / self.fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cap_bytes = cap_bytes
        self.saved = self.loaded = 0  # blocks written and read back, for tests and stats
        self._size: int | None = None  # bytes under root, counted on first need

    def save_group(self, group: SequenceGroup) -> None:
        """Write the full, cached blocks of ``group``'s sequences not on disk yet."""
        for seq in group.seqs:
            self.save(seq.token_ids)

    def save(self, token_ids: list[int]) -> int:
        """Write the cached blocks holding the start of ``token_ids``; returns how many
        were written. Never raises: a disk that fails loses warmth, not the reply."""
        written = 0
        try:
            for group, h, parent, tokens in self._chain(token_ids):
                block_id = self.block_manager.cached_block(group, h, parent, tokens)
                if block_id == HOLE:
                    if self.block_manager.windows[group] is None:
                        break
                    continue
                path = self._path(group, h)
                if path.exists():
                    os.utime(path)  # used again: the last to be evicted
                    continue
                self._write(path, group, h, parent, tokens, block_id)
                written += 1
        except OSError as error:
            log.warning("KV store %s: cannot write blocks (%s)", self.folder, error)
        self.saved += written
        if written:
            self._evict()
        return written

    def _write(self, path: Path, group: int, h: int, parent: int, tokens: tuple[int, ...],
               block_id: int) -> None:
        caches = [*self.runner.k_caches, *self.runner.v_caches]
        data = torch.stack([cache[block_id] for cache in caches]).cpu().contiguous()
        payload = data.view(torch.uint8).numpy().tobytes()
        header = json.dumps({
            "fingerprint": self.fingerprint, "group": group, "hash": h, "parent": parent,
            "tokens": list(tokens), "dtype": str(data.dtype), "shape": list(data.shape),
            "checksum": xxhash.xxh3_64_hexdigest(payload)}).encode()
        # a staging file left by a killed process still ends in SUFFIX: eviction finds it
        with staged_file(path, "wb", suffix=SUFFIX) as out:
            out.write(MAGIC + _HEADER.pack(len(header)) + header + payload)
        if self._size is not None:
            self._size += path.stat().st_size

    def load(self, token_ids: list[int]) -> int:
        """Read the blocks of ``token_ids``' prompt that the pool does not cache back into
        it, as cached blocks, from its start until the first one missing, where the pool
        has room for the whole prompt. Returns how many were read."""
        bm = self.block_manager
        if bm.num_free_blocks < bm.blocks_for(len(token_ids)) * bm.num_groups:
            return 0  # the prompt's blocks would push each other out
        loaded = 0
        for group, h, parent, tokens in self._chain(token_ids):
            if bm.cached_block(group, h, parent, tokens) != HOLE:
                continue
            data = self._read(self._path(group, h), group, h, parent, tokens)
            block_id = HOLE if data is None else bm.adopt(group, h, parent, tokens)
            if block_id == HOLE:
                if bm.windows[group] is None:
                    break
                continue
            caches = [*self.runner.k_caches, *self.runner.v_caches]
            for cache, part in zip(caches, data, strict=True):
                cache[block_id].copy_(part)
            loaded += 1
        self.loaded += loaded
        return loaded

    def _read(self, path: Path, group: int, h: int, parent: int,
              tokens: tuple[int, ...]) -> torch.Tensor | None:
        """The K/V of the block in ``path`` if it is the one asked for, else None."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            log.warning("KV store: cannot read %s (%s)", path, error)
            return None
        try:
            if not raw.startswith(MAGIC):
                raise ValueError("not a KV block file")
            start = len(MAGIC) + _HEADER.size
            (length,) = _HEADER.unpack_from(raw, len(MAGIC))
            header = json.loads(raw[start:start + length])
            payload = raw[start + length:]
            if header["fingerprint"] != self.fingerprint:
                log.warning("KV store: ignoring %s, written for another model or settings", path)
                return None
            if xxhash.xxh3_64_hexdigest(payload) != header["checksum"]:
                raise ValueError("its K/V do not match their checksum")
            dtype = getattr(torch, header["dtype"].removeprefix("torch."))
            expected = [len(self.runner.k_caches) * 2, *self.runner.kv_shape]
            if header["shape"] != expected or dtype != self.runner.kv_dtype:
                raise ValueError("its K/V have another shape or type than the pool's")
        except (ValueError, KeyError, TypeError, struct.error) as error:
            log.warning("KV store: ignoring and removing corrupt %s (%s)", path, error)
            path.unlink(missing_ok=True)
            return None
        if (header["group"], header["hash"], header["parent"], tuple(header["tokens"])) != (
                group, h, parent, tokens):
            return None  # another prefix under the same hash: a miss
        os.utime(path)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return data.view(dtype).view(header["shape"]).to(self.runner.k_caches[0].device)

    def _chain(self, token_ids: list[int]):
        """(group, chain hash, parent hash, tokens) of each full block of ``token_ids``
        but the last token, as the prefix cache keys them, every group per block."""
        bs = self.block_manager.block_size
        parent = NO_HASH
        for start in range(0, len(token_ids) - bs, bs):
            tokens = tuple(token_ids[start:start + bs])
            h = block_hash(parent, tokens)
            for group in range(self.block_manager.num_groups):
                yield group, h, parent, tokens
            parent = h

    def _path(self, group: int, h: int) -> Path:
        return self.folder / f"{group}-{h:016x}{SUFFIX}"

    def _evict(self) -> None:
        """Remove the least recently used files of every model until the store is back
        under nine tenths of its cap (so that not every write scans the folder)."""
        if self._size is None or self._size > self.cap_bytes:
            files = [(p.stat().st_mtime_ns, p.stat().st_size, p)
                     for p in self.root.glob(f"*/*{SUFFIX}")]
            self._size = sum(size for _, size, _ in files)
            if self._size <= self.cap_bytes:
                return
            for _, size, path in sorted(files):
                if self._size <= self.cap_bytes * 9 // 10:
                    break
                path.unlink(missing_ok=True)
                self._size -= size
