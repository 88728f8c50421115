"""mstopk: MSTop-K (multi-sampling Top-K; Shi et al. 2021, as evaluated by Agarwal et al. 2022), with error feedback.

Instead of an exact top-k, a threshold is searched: starting from the interval [mean|v|, max|v|] (or [0, max|v|]
when fewer than k entries exceed the mean), ``samplings`` bisection steps count the entries above a candidate
threshold and keep the tightest threshold t with count(|v| >= t) <= k. The entries above t are sent (at most k);
the message is padded to exactly k (index 0, value 0) so every rank contributes the same size to the all-gather.
Error feedback, communication and decode as topk. Payload per step: 8 k bytes per bucket per rank.
Options: ratio in (0, 1] (default 0.01), samplings (>= 1, default 20), error_feedback (default True).
"""

from __future__ import annotations

import torch

from runners.compressors._sparse import SparseState, sparse_hook
from runners.compressors.base import check_bool, check_int, check_ratio


class MSTopKState(SparseState):
    NAME = "mstopk"
    HYPERPARAMS = ("ratio", "samplings", "error_feedback")
    __slots__ = ("ratio", "samplings", "error_feedback", "error")

    def __init__(
        self, process_group=None, ratio: float = 0.01, samplings: int = 20, error_feedback: bool = True
    ) -> None:
        super().__init__(process_group)
        self.ratio = check_ratio(self.NAME, "ratio", ratio)
        self.samplings = check_int(self.NAME, "samplings", samplings, 1)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.error: dict[int, torch.Tensor] = {}

    def threshold(self, a: torch.Tensor, k: int) -> torch.Tensor:
        """Smallest bisection threshold t found with count(a >= t) <= k (a 0-d tensor; stays on device)."""
        hi = a.max()
        lo = a.mean()
        if int((a >= lo).sum()) < k:
            lo = torch.zeros_like(hi)
        best = hi
        for _ in range(self.samplings):
            mid = (lo + hi) / 2
            n = (a >= mid).sum()
            ok = n <= k
            best = torch.where(ok, torch.minimum(best, mid), best)
            hi = torch.where(ok, mid, hi)
            lo = torch.where(ok, lo, mid)
        return best

    def select(self, v: torch.Tensor, k: int):
        if k == v.numel():
            return torch.arange(k, device=v.device), k
        a = v.abs()
        t = self.threshold(a, k)
        chosen = torch.nonzero(a >= t).view(-1)[:k]
        c = chosen.numel()
        if c == k:
            return chosen, k
        idx = torch.zeros(k, dtype=torch.long, device=v.device)
        idx[:c] = chosen
        return idx, c


def mstopk_hook(state: MSTopKState, bucket):
    return sparse_hook(state, bucket)


STATE = MSTopKState
HOOK = mstopk_hook
