"""Shared code of fp16 and bf16: cast, divide, all-reduce, cast back (PyTorch's fp16/bf16_compress_hook)."""

from __future__ import annotations

import torch

from runners.compressors.base import CompressorState, allreduce_then


class CastState(CompressorState):
    DTYPE = torch.float16
    LOSSLESS = True  # up to the 16-bit rounding: TOLERANCE is relative to the largest gradient entry
    TOLERANCE = 2e-3
    __slots__ = ()


def cast_hook(state: CastState, bucket) -> torch.futures.Future:
    """1. encode: cast to the 16-bit type, then divide by the world size in 16 bits (as PyTorch does: no full-size
    fp32 temporary); 2. all-reduce (sum) issued in the hook; 3. decode: copy (cast) back into the fp32 bucket.
    One collective per bucket, issued in the hook: order is safe; with overlap on the decode is chained on the
    collective's future and DDP's overlap is kept, with overlap off the hook waits."""
    buf = bucket.buffer()
    index = bucket.index()
    stats = state.stats
    stats.bind(buf.device)
    t = stats.start()
    low = buf.to(state.DTYPE).div_(state.world_size)
    stats.stop("encode", index, t)
    fut = allreduce_then(state, low, index, buf.copy_)
    state.maybe_increase_iter(bucket)
    stats.end_hook()
    return fut
