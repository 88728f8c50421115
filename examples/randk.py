"""Random-k sparsification with error feedback: a complete compressor plugin for the gc-testbed.

Use it without installing anything:

    testbed check-compressor randk:make --plugin-path examples
    testbed run --bw 100mbit --compressor randk:make --plugin-path examples --opt ratio=0.05

Algorithm, per DDP bucket (flat gradient g of n entries, world size p, step t):
  1. e <- g + residual (error feedback: what earlier steps did not send)
  2. pick k = max(1, ratio x n) indices with a generator seeded by (seed, t, bucket index): every rank picks the same
     ones, so the selected values can be summed with one all-reduce (no all-gather, no index exchange)
  3. all-reduce e[idx] / p, issued inside the hook (never from a callback: every rank issues its collectives in
     DDP's bucket order); residual <- e with e[idx] zeroed
  4. decode (chained on the collective's future, issues nothing and waits for nothing): g <- 0, g[idx] <- sum
The first two steps are dense all-reduces: DDP rebuilds its buckets after iteration 1, and a residual kept across
the rebuild would belong to another layout.

This module imports nothing of the testbed: a plugin is any importable module with a factory
``make(process_group=None, **options) -> (state, hook)``. The class attributes below tell the testbed's model and
report what the hook does; ``state_dict``/``load_state_dict`` make it resumable.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

__version__ = "1.0"


class RandKState:
    COLLECTIVE = "allreduce"  # one all-reduce of k values per bucket
    ROUNDS = 1
    OVERLAPS = True  # the hook returns the collective's future un-waited
    LOSSLESS = False
    WARMUP_STEPS = 2

    def __init__(self, process_group=None, ratio: float = 0.01, error_feedback: bool = True, seed: int = 0) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1:
            raise ValueError(f"randk ratio {ratio!r} is outside (0, 1]")
        if not isinstance(error_feedback, bool):
            raise ValueError(f"randk error_feedback {error_feedback!r} is not accepted: expected true or false")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"randk seed {seed!r} is not accepted: expected an integer >= 0")
        self.process_group = process_group
        self.ratio = float(ratio)
        self.error_feedback = error_feedback
        self.seed = seed
        self.step = 0
        self.residuals: dict[int, torch.Tensor] = {}

    @property
    def warmup_iters(self) -> int:  # the runner measures only after these
        return self.WARMUP_STEPS

    def options(self) -> dict:
        return {"ratio": self.ratio, "error_feedback": self.error_feedback, "seed": self.seed}

    def state_dict(self) -> dict:
        return {
            "options": self.options(),
            "step": self.step,
            "residuals": {i: r.clone() for i, r in self.residuals.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if state["options"] != self.options():
            raise ValueError(f"randk state_dict options {state['options']} differ from {self.options()}")
        self.step = int(state["step"])
        self.residuals = {int(i): r.clone() for i, r in state["residuals"].items()}


def randk_hook(state: RandKState, bucket) -> torch.futures.Future:
    buf = bucket.buffer()
    index = bucket.index()
    world = dist.get_world_size(state.process_group)
    step = state.step
    if bucket.is_last():
        state.step += 1
    if step < state.WARMUP_STEPS:  # dense: average the bucket
        buf.div_(world)
        fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    n = buf.numel()
    residual = state.residuals.get(index)
    e = buf + residual if (state.error_feedback and residual is not None and residual.numel() == n) else buf.clone()
    k = max(1, int(state.ratio * n))
    gen = torch.Generator().manual_seed(state.seed * 1_000_003 + step * 10_007 + index)
    idx = torch.randperm(n, generator=gen)[:k].to(buf.device)
    values = e[idx].div_(world)
    if state.error_feedback:
        e[idx] = 0
        state.residuals[index] = e
    fut = dist.all_reduce(values, group=state.process_group, async_op=True).get_future()

    def decode(f: torch.futures.Future) -> torch.Tensor:
        buf.zero_()
        buf[idx] = f.value()[0]
        return buf

    return fut.then(decode)


def make(process_group=None, **options) -> tuple[RandKState, object]:
    """The factory the testbed calls: ``--compressor randk:make --opt ratio=0.05``."""
    return RandKState(process_group, **options), randk_hook
