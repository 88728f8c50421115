"""topk: Top-K sparsification with error feedback (Aji & Heafield 2017; Stich et al. 2018).

Algorithm, per bucket (v = flat bucket + E, d elements, k = ceil(ratio d)):
  1. I = indices of the k largest |v| (exact ``torch.topk``); send values v[I] (fp32) and I (int32).
  2. E = v with v[I] set to 0 (what was not sent).
  3. ONE all-gather of every rank's (values, indices); result = (sum of scattered values) / n.
Selection is over the whole bucket (all tensors of the bucket together, 1-D ones included).
The all-gather is issued in the hook, decode chained (overlap on) or waited there (off).
Communication: 1 all-gather per bucket.
Payload per step: 8 k bytes per bucket per rank (4 value + 4 index); each rank receives (n - 1) times that.
Options: ratio in (0, 1] (default 0.01), error_feedback (default True).
"""

from __future__ import annotations

import torch

from runners import catalog
from runners.compressors._sparse import SparseState, sparse_hook
from runners.compressors.base import check_bool, check_ratio


class TopKState(SparseState):
    NAME = "topk"
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    __slots__ = (*HYPERPARAMS, "error")

    def __init__(self, process_group=None, ratio: float = 0.01, error_feedback: bool = True) -> None:
        super().__init__(process_group)
        self.ratio = check_ratio(self.NAME, "ratio", ratio)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.error: dict[int, torch.Tensor] = {}

    def select(self, v: torch.Tensor, k: int):
        if k == v.numel():
            return torch.arange(k, device=v.device), k
        return torch.topk(v.abs(), k, sorted=False).indices, k


def topk_hook(state: TopKState, bucket):
    return sparse_hook(state, bucket)


STATE = TopKState
HOOK = topk_hook
