"""Shared code of fp16 and bf16: cast, all-reduce, cast back."""

from __future__ import annotations

import torch
import torch.distributed as dist

from runners.compressors.base import CompressorState


class CastState(CompressorState):
    COLLECTIVE = "allreduce"
    ROUNDS = 1
    DTYPE = torch.float16
    HYPERPARAMS = ()
    __slots__ = ()


def cast_hook(state: CastState, bucket) -> torch.futures.Future:
    """1. encode: divide by the world size (avoids overflow) and cast to the 16-bit type;
    2. all-reduce (sum) un-waited; 3. decode (in the future's callback): cast back into the fp32 bucket buffer.
    One collective per bucket, issued in the hook: order is safe and DDP's overlap is kept."""
    buf = bucket.buffer()
    index = bucket.index()
    stats = state.stats
    stats.bind(buf.device)
    t = stats.start()
    low = buf.div(state.world_size).to(state.DTYPE)
    stats.stop("encode", index, t)
    stats.add_payload(index, low.numel() * low.element_size())
    fut = dist.all_reduce(low, group=state.process_group, async_op=True).get_future()
    state.maybe_increase_iter(bucket)
    stats.end_hook()

    def decode(f):
        t2 = stats.start()
        out = buf.copy_(f.value()[0])
        stats.stop("decode", index, t2, critical=False)
        return out

    return fut.then(decode)
