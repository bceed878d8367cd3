"""Which branches of a conversation share the KV blocks of a reply being written.

A regenerated reply or an edited message starts a branch whose prompt begins like the other
branches': the prefix cache hands it their blocks. This remembers the block tables of this
run's requests (from the engine's snapshots), and names the earlier requests of a session
whose blocks the live one holds again, by where their conversations part ("reply 1/3")."""

from __future__ import annotations

from pagedchat.chat.conversation import Message
from pagedchat.engine.outputs import SeqBlockTable


class BranchBlocks:
    """Per request id, the physical block it was last seen holding at each (layer group,
    logical block) of its first sequence."""

    def __init__(self) -> None:
        self.held: dict[str, dict[tuple[int, int], int]] = {}

    def record(self, tables: list[SeqBlockTable]) -> None:
        for table in tables:
            if table.seq_index == 0:
                places = self.held.setdefault(table.request_id, {})
                for entry in table.blocks:
                    places[table.layer_group, entry.logical] = entry.physical

    def shared(self, live: str, earlier: str, hit_blocks: int) -> int:
        """Blocks of ``live``'s prompt taken from the prefix cache (its first ``hit_blocks``
        of each layer group) that ``earlier`` held at the same places: a run from the first
        block on, as a prefix hit is."""
        mine, theirs = self.held.get(live, {}), self.held.get(earlier, {})
        count = 0
        for group in sorted({group for group, _ in mine}):
            for logical in range(hit_blocks):
                block = mine.get((group, logical))
                if block is None or theirs.get((group, logical)) != block:
                    break
                count += 1
        return count


def fork_label(live: list[Message], earlier: list[Message]) -> str:
    """How ``earlier``'s conversation (its messages up to its reply) parts from ``live``'s,
    named from the live one's point of view."""
    for place, (mine, theirs) in enumerate(zip(live, earlier, strict=False)):
        if mine.id != theirs.id:
            count = max(mine.branch[1], theirs.branch[1])
            if theirs.role == "assistant":
                return f"reply {theirs.branch[0]}/{count}"
            return f"message {place + 1}, version {theirs.branch[0]}/{count}"
    if len(earlier) == len(live):
        return "this reply before it was continued"
    return f"the turn at message {len(earlier)}"


def branch_lines(branches: BranchBlocks, live: list[str], paths: dict[str, list[Message]],
                 block_size: int) -> list[str]:
    """"12 blocks shared with reply 1/2" for each earlier request of the live requests' session
    whose blocks they took from the prefix cache; ``paths``: each request's messages, reply last."""
    counts: dict[str, int] = {}  # requests of one branch (its replies) named once
    for rid in live:
        if not (path := paths.get(rid)):
            continue
        hit_blocks = path[-1].cached_tokens // block_size
        for other, other_path in paths.items():
            if other == rid or other in live:
                continue
            count = branches.shared(rid, other, hit_blocks)
            label = fork_label(path, other_path)
            if count > counts.get(label, 0):
                counts[label] = count
    return [f"{count} blocks shared with {label}" for label, count in counts.items()]
