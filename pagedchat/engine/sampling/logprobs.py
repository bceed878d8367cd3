"""Per-token log-probabilities for requests that ask for them (SamplingParams.logprobs)."""

from __future__ import annotations

import torch

from pagedchat.engine.outputs import Logprob


def token_logprobs(logits: torch.Tensor, chosen: list[int], ks: list[int],
                   ) -> list[dict[int, Logprob]]:
    """Per row: the chosen token's log-probability and rank, then the ``k`` most likely
    tokens' (the chosen one is not repeated), under the softmax of the row's raw logits."""
    logprobs = logits.float().log_softmax(dim=1)
    index = torch.tensor(chosen, dtype=torch.int64).unsqueeze(1)
    picked = logprobs.gather(1, index)
    ranks = (logprobs > picked).sum(dim=1) + 1
    top_values = top_ids = None
    if max(ks) > 0:
        top_values, top_ids = logprobs.topk(max(ks), dim=1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    entries = []
    for i, (token, k) in enumerate(zip(chosen, ks, strict=True)):
        entry = {token: Logprob(float(picked[i, 0]), int(ranks[i]))}
        for rank in range(k):
            entry.setdefault(top_ids[i][rank], Logprob(top_values[i][rank], rank + 1))
        entries.append(entry)
    return entries
