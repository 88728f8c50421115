"""DDP bucket bookkeeping shared by the runner (serial mode) and the profiler.

``BucketRecorder`` wraps a comm hook: each call records the bucket (index, flat buffer, gradient shapes,
parameters) and when DDP handed it over, then calls the real hook. After DDP's bucket rebuild (iteration 1) the
recorded layout is the final one; ``serial_reduce`` then runs the same hook on the recorded buckets, in DDP's
order, outside of backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runners.compressors.base import FlatBucket


@dataclass
class BucketInfo:
    index: int
    buffer: torch.Tensor
    shapes: list[tuple[int, ...]]
    parameters: list[torch.nn.Parameter]
    ready_mark: object = None


class BucketRecorder:
    def __init__(self, clock) -> None:
        self.clock = clock
        self.buckets: dict[int, BucketInfo] = {}
        self.order: list[int] = []

    def reset_order(self) -> None:
        self.order = []

    def wrap(self, hook):
        def recording_hook(state, bucket):
            index = bucket.index()
            self.buckets[index] = BucketInfo(
                index=index,
                buffer=bucket.buffer(),
                shapes=[tuple(g.shape) for g in bucket.gradients()],
                parameters=list(bucket.parameters()),
                ready_mark=self.clock.now() if self.clock is not None else None,
            )
            self.order.append(index)
            return hook(state, bucket)

        return recording_hook

    def ordered(self) -> list[BucketInfo]:
        return [self.buckets[i] for i in sorted(self.buckets)]

    def grads_are_views(self) -> bool:
        """True when every parameter's .grad lives in its bucket's buffer (gradient_as_bucket_view=True)."""
        for info in self.buckets.values():
            ptr = info.buffer.untyped_storage().data_ptr()
            for p in info.parameters:
                if p.grad is None or p.grad.untyped_storage().data_ptr() != ptr:
                    return False
        return True


def flat_buckets(recorder: BucketRecorder, use_views: bool) -> list[tuple[FlatBucket, BucketInfo]]:
    """FlatBuckets over the recorded layout, filled from the parameters' current gradients."""
    infos = recorder.ordered()
    out = []
    for pos, info in enumerate(infos):
        if use_views:
            buf = info.buffer
        else:
            buf = torch.cat([p.grad.reshape(-1) for p in info.parameters])
        out.append((FlatBucket(info.index, buf, info.shapes, pos == len(infos) - 1, info.parameters), info))
    return out


def serial_reduce(state, hook, recorder: BucketRecorder, use_views: bool) -> None:
    """Reduce every bucket with ``hook`` after backward: all hooks in DDP's order, then all waits in order,
    then the results written back into the gradients."""
    pairs = flat_buckets(recorder, use_views)
    futures = [hook(state, fb) for fb, _ in pairs]
    for (_fb, info), fut in zip(pairs, futures, strict=True):
        result = fut.wait()
        if isinstance(result, list):
            result = result[0]
        if use_views:
            if result.data_ptr() != info.buffer.data_ptr():
                info.buffer.copy_(result)
        else:
            off = 0
            for p in info.parameters:
                n = p.grad.numel()
                p.grad.copy_(result[off : off + n].view_as(p.grad))
                off += n
