"""The greedy token of each row, without the whole vocabulary's exact logits.

A request that only wants the most likely token (temperature 0, no log-probabilities, no
penalties or constraints) needs one logit per row to be exact: the largest. The head
first multiplies 8-bit activations (llama.cpp's product, integer sums), then bounds how
far each approximate logit can be from the exact one, keeps the tokens whose bound still
reaches the best lower end of their row, and takes the exact float32 logits of those few
alone. The exact maximum is always kept, so the token is the one the whole head would
pick.

The bound, for weight row w (its exact values) and input x rounded to x8:
``|approx - exact| <= |w| |x - x8| + u (k |x| + (k / 32 + 4) |x8|) |w|`` (Cauchy-Schwarz
for the rounding of x; u = 2^-23 covers the float32 rounding of either product's sums of
k terms). Only Q8_0 heads are screened: their 8-bit product is one integer sum times one
scale per block, which that rounding term covers; other formats take the whole head, as
do soft-capped heads (the model does not build one: see CausalLM.pack). Where the screen
is not faster (few rows; CPUs whose 8-bit product gains little), the model takes the whole
head: see FasterWay."""

from __future__ import annotations

import statistics
from types import ModuleType

import torch

from pagedchat.kernels.quant import QuantizedWeight, round_activations, row_norms

UNIT_ROUNDOFF = 2.0 ** -23
# candidates kept per row; a row with more (its bound is loose) takes the whole head
CAPACITY = 256


class FasterWay:
    """Which of two exact ways (same tokens) to take for a batch of ``rows``: each is timed on
    its first ``trials`` calls for that size (sizes grouped by powers of two), in turn, then the
    one with the lower median is kept; which is faster depends on the CPU and the batch."""

    def __init__(self, trials: int = 3) -> None:
        self.trials = trials
        self.times: dict[int, tuple[list[float], list[float]]] = {}
        self.chosen: dict[int, bool] = {}

    def screen(self, rows: int) -> bool:
        """Whether to take the screen (True) or the whole head for ``rows`` rows now."""
        size = rows.bit_length()
        if size in self.chosen:
            return self.chosen[size]
        whole, screened = self.times.setdefault(size, ([], []))
        return len(screened) < len(whole)

    def took(self, rows: int, screen: bool, seconds: float) -> None:
        size = rows.bit_length()
        if size in self.chosen:
            return
        whole, screened = self.times.setdefault(size, ([], []))
        (screened if screen else whole).append(seconds)
        if len(screened) >= self.trials and len(whole) >= self.trials:
            self.chosen[size] = statistics.median(screened) < statistics.median(whole)


class GreedyHead:
    """The most likely token of each row of ``x @ W.T`` for a Q8_0 ``W``, exact, from an
    8-bit screen and the exact logits of its candidates."""

    def __init__(self, weight: QuantizedWeight, kernels: ModuleType) -> None:
        if not self.supports(weight):
            raise ValueError(f"a greedy head screens Q8_0 weights, not {weight!r}")
        self.weight, self.kernels = weight, kernels
        # the same blocks, multiplied with 8-bit activations
        self.int8_weight = QuantizedWeight(weight.segments, weight.in_features,
                                           int8_activations=True)
        self.norms = row_norms(weight)
        self.way = FasterWay()

    @staticmethod
    def supports(weight: object) -> bool:
        return (isinstance(weight, QuantizedWeight) and bool(weight.segments)
                and all(s.format.name == "Q8_0" for s in weight.segments))

    def slack(self, x: torch.Tensor) -> torch.Tensor:
        """Per row of x: the bound on |approx - exact| divided by the weight row's norm."""
        wide, rounded, k = x.double(), round_activations(x).double(), x.shape[1]
        rounding, whole, kept = torch.linalg.vector_norm(
            torch.stack((wide - rounded, wide, rounded)), dim=2)
        sums = UNIT_ROUNDOFF * (k * whole + (k // 32 + 4) * kept)
        return ((rounding + sums) * (1 + UNIT_ROUNDOFF)).float()

    def tokens(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The greedy token of each float32 row of ``x`` ``[rows, in_features]``, int64: the
        first index of the largest of ``x @ W.T``. ``out``: a float32
        ``[rows, out_features]`` buffer for the 8-bit logits."""
        x = x.contiguous()
        approx = self.kernels.quantized_linear(x, self.int8_weight, out=out)
        found, counts = self.kernels.screen_candidates(approx, self.norms, self.slack(x), CAPACITY)
        del approx
        screened = counts <= CAPACITY
        if bool(screened.all()):  # the usual case
            return self._best(x, found)
        tokens = torch.empty(x.shape[0], dtype=torch.int64)
        tokens[~screened] = self.kernels.quantized_linear(x[~screened], self.weight).argmax(dim=1)
        if bool(screened.any()):
            tokens[screened] = self._best(x[screened], found[screened])
        return tokens

    def _best(self, x: torch.Tensor, found: torch.Tensor) -> torch.Tensor:
        """The exact best of each row's candidates (``found``: increasing, -1 past the last)."""
        valid = found >= 0
        union = found[valid] if len(x) == 1 else found[valid].unique()
        logits = self.kernels.quantized_linear(x, self.weight.take_rows(union.long()))
        if len(x) > 1:  # each row's best among its own candidates only
            mine = torch.zeros(logits.shape, dtype=torch.bool)
            rows = torch.arange(len(x)).unsqueeze(1).expand_as(found)
            mine[rows[valid], torch.searchsorted(union, found[valid])] = True
            logits.masked_fill_(~mine, float("-inf"))
        return union[logits.argmax(dim=1)].long()
