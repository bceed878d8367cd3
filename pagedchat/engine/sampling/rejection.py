"""Speculative sampling's acceptance test for a drafted token (Leviathan et al., 2023;
Chen et al., 2023), for a draft that proposes one token with certainty (n-gram drafting).

With a point-mass draft q = [t], the rule "keep t with probability min(1, p(t) / q(t)),
else draw from max(p - q, 0) renormalised" becomes: keep t with probability p(t), else
draw from p with t removed and renormalised. Either way the token returned is distributed
as p, the target distribution the sampler would draw from."""

from __future__ import annotations

import torch


def accept_draft(probs: torch.Tensor, draft: int, generator: torch.Generator | None) -> int:
    """The token at one drafted position: ``draft`` itself when accepted, else a token
    other than it. ``probs``: the target distribution (one row, summing to one)."""
    if float(torch.rand((), generator=generator)) < float(probs[draft]):
        return draft
    rest = probs.to(torch.float64, copy=True)
    rest[draft] = 0.0
    if not float(rest.sum()) > 0.0:  # all the mass on the draft: rounding drew past it
        return draft
    return int(torch.multinomial(rest, 1, generator=generator))
