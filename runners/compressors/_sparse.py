"""Shared code of the sparsifying compressors (topk, mstopk): error feedback, one all-gather of
(values, indices), scatter-add decode."""

from __future__ import annotations

import math

import torch

from runners.compressors.base import CompressorState, allgather_then, start_error_feedback_hook


class SparseState(CompressorState):
    BUFFERS = ("error",)
    __slots__ = ()

    @property
    def warmup_iters(self) -> int:
        return 2 if self.error_feedback else 0

    def k_for(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def select(self, v: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
        """(indices, count): exactly k int64 indices, of which the first ``count`` are chosen and the rest
        padding (sent with value 0, so they add nothing)."""
        raise NotImplementedError


def sparse_hook(state: SparseState, bucket) -> torch.futures.Future:
    """1. v = bucket + E; 2. pick k indices (``state.select``); 3. E = v with the picked entries zeroed;
    4. ONE all-gather of [values (fp32) | indices (int32 bits)], issued in the hook (overlap on: un-waited, decode
       chained; off: waited in the hook);
    5. decode: scatter-add every rank's values, divide by n."""
    buf = bucket.buffer()
    index = bucket.index()
    _, warmup = start_error_feedback_hook(state, bucket)
    if warmup is not None:
        return warmup
    stats = state.stats
    stats.bind(buf.device)
    d = buf.numel()
    k = state.k_for(d)
    t = stats.start()
    if state.error_feedback:
        err = state.error.get(index)
        if err is not None:
            buf.add_(err)
    idx, count = state.select(buf, k)
    values = buf[idx].float()
    if count < k:
        values[count:] = 0
    if state.error_feedback:
        err = buf.clone()
        err[idx[:count]] = 0
        state.error[index] = err
    payload = torch.cat([values, idx.to(torch.int32).view(torch.float32)])
    stats.stop("encode", index, t)

    def decode(gathered):
        all_vals = gathered[:, :k].reshape(-1)
        all_idx = gathered[:, k:].clone().view(torch.int32).reshape(-1).long()
        buf.zero_()
        buf.index_add_(0, all_idx, all_vals.to(buf.dtype))
        return buf.div_(gathered.shape[0])

    fut = allgather_then(state, payload, index, decode)
    state.maybe_increase_iter(bucket)
    stats.end_hook()
    return fut
