"""The block pool's records: a block, a prefix-cache hit, the host swap pool, the prompts whose last
rows the runner keeps, and the chained hash that names a full block by everything before it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import xxhash

NO_HASH = -1
HOLE = -1  # a table entry whose block slid out of its group's window


def block_hash(parent_hash: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """The chained hash of one full block: its tokens and everything before them."""
    digest = xxhash.xxh3_64()
    digest.update(parent_hash.to_bytes(8, "little", signed=True))
    digest.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return digest.intdigest() & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class Block:
    """One physical block of the pool, in exactly one of three states: referenced
    (``ref_count > 0``, in block tables); cached-evictable (``ref_count == 0``, a full block
    found again by its hash, kept in LRU order and reused only when no free block is left);
    free (``ref_count == 0``, no hash)."""

    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    parent_hash: int = NO_HASH
    token_ids: tuple[int, ...] = ()
    group: int = 0  # the layer group whose table holds it (its prefix-cache key)


@dataclass(frozen=True)
class PrefixHit:
    """Cached blocks holding the start of a sequence: per group, a table as long as the hit
    (``HOLE`` where a windowed group's block lies wholly before the first token left to
    compute's window), and the blocks' chain hashes. ``tail``: per group, a cached full block
    beginning with the sequence's tokens after those (all but its last, or all with
    ``kept_slot``), to copy into a block of its own; ``num_tokens``: the tokens the hit
    computes, the tail's included. ``kept_slot``: where the hit covers every token, the
    runner's slot keeping the last token's hidden state, which the next token is sampled from."""

    tables: tuple[tuple[int, ...], ...] = ()
    hashes: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()
    num_tokens: int = 0
    kept_slot: int | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)

    def block_ids(self) -> set[int]:
        """Every cached block the hit takes (a tail's source only until it is copied)."""
        return {block_id for table in (*self.tables, self.tail) for block_id in table
                if block_id != HOLE}


NO_HIT = PrefixHit()


class HostPool:
    """The host-memory swap pool: its own free list and reference counts."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.ref_counts = [0] * num_blocks
        self.saved: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def allocate(self, source: Block) -> int:
        block_id = self.free_ids.pop()
        self.ref_counts[block_id] = 1
        self.saved[block_id] = Block(block_id, 0, source.hash, source.parent_hash,
                                     source.token_ids, source.group)
        return block_id

    def release(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            del self.saved[block_id]
            self.free_ids.append(block_id)


class KeptRows:
    """The prompts whose last row's final hidden state the runner keeps: the whole token tuple (only
    that exact prompt is a hit) -> the runner's slot, least recently used given up first."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slots: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def find(self, token_ids: list[int]) -> int | None:
        """The slot keeping the row of exactly these tokens, or None."""
        return self.slots.get(tuple(token_ids))

    def use(self, slot: int) -> None:
        """A step reads ``slot``: it becomes the most recently used."""
        key = next(key for key, held in self.slots.items() if held == slot)
        self.slots.move_to_end(key)

    def keep(self, prompts: list[tuple[int, ...]]) -> list[int | None]:
        """Slots for the prompts whose last rows the coming step computes, no slot given twice (the
        step writes them all): None for a prompt kept already, and once every slot is given."""
        given: list[int | None] = []
        for key in prompts:
            slot = None
            if key in self.slots:
                self.slots.move_to_end(key)
            elif len(self.slots) < self.num_slots:  # slots are only dropped all at once
                slot = len(self.slots)
            else:
                victim = next((old for old, held in self.slots.items() if held not in given), None)
                slot = None if victim is None else self.slots.pop(victim)
            if slot is not None:
                self.slots[key] = slot
            given.append(slot)
        return given

    def clear(self) -> None:
        self.slots.clear()


def held_blocks(tables_per_seq) -> set[int]:
    """The distinct blocks named by these sequences' tables (holes left out)."""
    return {block_id for tables in tables_per_seq for table in tables for block_id in table
            if block_id != HOLE}
