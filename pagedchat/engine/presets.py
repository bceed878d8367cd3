"""What each command builds its engine with: one table, so that no two entry points decide
the pool, the batch limit, the swap pool or a reply's default length apart. A command's
flags default to its row; the library (``LLM``, ``LLMEngine``) keeps ``EngineConfig``'s own."""

from __future__ import annotations

from dataclasses import dataclass

# the CPU pool preempted sequences are swapped to, where preemption swaps
SWAP_SPACE = "1GiB"
# the most tokens a speculative step drafts, for every entry point and the library
SPECULATIVE_TOKENS = 6


def swap_space(preemption_mode: str) -> str:
    """A CPU swap pool only where preemption swaps (``recompute`` never reads one): it
    costs memory and start time."""
    return SWAP_SPACE if preemption_mode == "swap" else "0B"


@dataclass(frozen=True)
class Preset:
    """An entry point's engine defaults."""

    # a reply's default length; None: the request's own (serve: as many as fit; bench: the
    # trace's lengths)
    max_tokens: int | None
    # the KV pool in blocks; None: EngineConfig's memory budget (--kv-memory), or for
    # ``run`` a pool sized to its one request
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    # the pool holds what one request can need, and nothing for others
    pool_per_request: bool = False


PRESETS = {
    "chat": Preset(max_tokens=512, num_kv_blocks=512),
    "run": Preset(max_tokens=512, pool_per_request=True), "serve": Preset(max_tokens=None),
    "batch": Preset(max_tokens=256), "inspect": Preset(max_tokens=24, num_kv_blocks=128),
    "bench": Preset(max_tokens=None)}
