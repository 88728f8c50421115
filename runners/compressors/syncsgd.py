"""syncsgd: the uncompressed baseline, DDP's own all-reduce.

Algorithm: average every gradient bucket with one all-reduce (sum, then divide by the world size).
Options: ``builtin`` (default True): the runner registers no hook at all, so DDP runs its C++ all-reduce with its
usual overlap; payload bytes are then accounted by the runner from the bucket sizes (``dense_bytes``). With
``builtin=False`` the Python hook below does the same all-reduce (useful to measure the cost of a Python hook).
Communication: one all-reduce per bucket. Payload per step: 4 d bytes (d = gradient elements, fp32).
"""

from __future__ import annotations

from runners import catalog
from runners.compressors.base import CompressorState, allreduce_mean_async, check_bool


class SyncSGDState(CompressorState):
    NAME = "syncsgd"
    LOSSLESS = True
    TOLERANCE = 1e-6  # divide-then-sum vs sum-then-divide rounding
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    __slots__ = (*HYPERPARAMS, "dense_bytes")

    def __init__(self, process_group=None, builtin: bool = True) -> None:
        super().__init__(process_group)
        self.builtin = check_bool(self.NAME, "builtin", builtin)
        # Set by runners.compressors.attach() from the model's gradients when builtin (no hook sees the buckets).
        self.dense_bytes = 0


def syncsgd_hook(state: SyncSGDState, bucket):
    """Average the bucket with one un-waited all-reduce (same as DDP's built-in reduction)."""
    state.maybe_increase_iter(bucket)
    return allreduce_mean_async(state, bucket)


STATE = SyncSGDState
HOOK = syncsgd_hook
