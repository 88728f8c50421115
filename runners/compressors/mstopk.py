"""mstopk: MSTop-K (multi-sampling Top-K; Shi et al. 2021, as Agarwal et al. 2022 ran it), with error feedback.

Algorithm, per bucket (v = flat bucket + E, a = |v|, d elements, k = ceil(ratio d)):
  1. Threshold search on a sample: S = every ceil(d / SAMPLE)-th entry of a (s entries, s = d when d <= SAMPLE),
     k_s = k s / d. Shi's bisection (``samplings`` steps over [mean S, max S], or [0, max S] when fewer than the
     target exceed the mean) finds thres1 = the smallest tried threshold with count(S >= thres1) <= (1 - MARGIN) k_s
     and thres2 = the largest tried threshold with count(S >= thres2) > (1 + MARGIN) k_s + 4.
  2. On the whole bucket: I1 = {a >= thres1} (c1 entries), band B = {thres2 <= a < thres1}.
     As Shi et al. (Agarwal's msTopK): send I1 and fill the remaining k - c1 slots with entries drawn at random
     (a seeded generator per state) from the band, so exactly k real values are sent.
     If c1 > k the k largest of I1 are sent; if c1 + |B| < k (the sample misled; rare) an exact top-k is sent.
  3. E = v with the sent entries zeroed; ONE all-gather of every rank's (values, indices); decode = scatter-add / n.
The search touches the s-entry sample ``2 samplings`` times and the bucket a constant number of times, so on this
CPU it costs about as much as an exact ``torch.topk`` (see docs/compressors.md for the timing).
Payload per step: 8 k bytes per bucket per rank.
Options: ratio in (0, 1] (default 0.01), samplings (>= 1, default 20), error_feedback (default True), seed.
"""

from __future__ import annotations

import math

import torch

from runners import catalog
from runners.compressors._sparse import SparseState, sparse_hook
from runners.compressors.base import check_bool, check_int, check_ratio

SAMPLE = 16384  # entries the threshold search looks at
MARGIN = 0.25  # relative band around k_s: the sampled count's noise is ~1/sqrt(k_s) (8% at k_s = 164)


def bisect(sample: torch.Tensor, target: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shi et al.'s threshold bisection on ``sample`` (>= 0): (t_le, t_gt), the smallest tried threshold with
    count(sample >= t) <= target (inf if none) and the largest tried with count > target (0 if none). 0-d tensors.
    CUDA: stays on the device (no host sync); CPU: Python scalars (cheaper than 0-d tensor arithmetic)."""
    if sample.device.type == "cpu":
        hi = float(sample.max())
        lo = float(sample.mean())
        if int((sample >= lo).sum()) <= target:
            lo = 0.0
        t_le, t_gt = math.inf, 0.0
        for _ in range(steps):
            mid = (lo + hi) / 2
            if int((sample >= mid).sum()) <= target:
                t_le, hi = min(t_le, mid), mid
            else:
                t_gt, lo = max(t_gt, mid), mid
        return torch.tensor(t_le, dtype=sample.dtype), torch.tensor(t_gt, dtype=sample.dtype)
    hi = sample.max()
    lo = sample.mean()
    lo = torch.where((sample >= lo).sum() > target, lo, torch.zeros_like(lo))
    t_le = torch.full_like(hi, math.inf)
    t_gt = torch.zeros_like(hi)
    for _ in range(steps):
        mid = (lo + hi) / 2
        ok = (sample >= mid).sum() <= target
        t_le = torch.where(ok, torch.minimum(t_le, mid), t_le)
        t_gt = torch.where(ok, t_gt, torch.maximum(t_gt, mid))
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid)
    return t_le, t_gt


class MSTopKState(SparseState):
    NAME = "mstopk"
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    __slots__ = (*HYPERPARAMS, "error", "generator")

    def __init__(
        self, process_group=None, ratio: float = 0.01, samplings: int = 20, error_feedback: bool = True, seed: int = 0
    ) -> None:
        super().__init__(process_group)
        self.ratio = check_ratio(self.NAME, "ratio", ratio)
        self.samplings = check_int(self.NAME, "samplings", samplings, 1)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.seed = check_int(self.NAME, "seed", seed, 0)
        self.error: dict[int, torch.Tensor] = {}
        self.generator = None  # band draws; created on the bucket's device at first use

    def state_dict(self) -> dict:
        """Also the band generator's position (without it a resumed run draws other fill entries; found by
        `testbed check-compressor mstopk`)."""
        out = super().state_dict()
        gen = self.generator
        out["generator"] = None if gen is None else {"device": str(gen.device), "state": gen.get_state().clone()}
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = state.get("generator")
        self.generator = None
        if saved is not None:
            self.generator = torch.Generator(device=saved["device"])
            self.generator.set_state(saved["state"].clone())

    def thresholds(self, a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(thres1, thres2) from the sample of ``a`` (step 1)."""
        d = a.numel()
        stride = max(1, -(-d // SAMPLE))
        sample = a[::stride].contiguous() if stride > 1 else a
        ks = k * sample.numel() / d
        thres1, _ = bisect(sample, (1 - MARGIN) * ks, self.samplings)
        _, thres2 = bisect(sample, (1 + MARGIN) * ks + 4, self.samplings)
        return thres1, thres2

    def select(self, v: torch.Tensor, k: int):
        if k == v.numel():
            return torch.arange(k, device=v.device), k
        a = v.abs()
        thres1, thres2 = self.thresholds(a, k)
        top = a >= thres1
        chosen = torch.nonzero(top).view(-1)
        c1 = chosen.numel()
        if c1 >= k:
            if c1 > k:
                chosen = chosen[torch.topk(a[chosen], k, sorted=False).indices]
            return chosen, k
        band = torch.nonzero((a >= thres2) & ~top).view(-1)
        if c1 + band.numel() < k:
            return torch.topk(a, k, sorted=False).indices, k
        if self.generator is None or self.generator.device != v.device:
            self.generator = torch.Generator(device=v.device).manual_seed(self.seed)
        fill = band[torch.randperm(band.numel(), generator=self.generator, device=v.device)[: k - c1]]
        return torch.cat([chosen, fill]), k


def mstopk_hook(state: MSTopKState, bucket):
    return sparse_hook(state, bucket)


STATE = MSTopKState
HOOK = mstopk_hook
