"""fp16: cast the bucket to IEEE half precision, all-reduce, cast back.

Algorithm: g_avg = fp32( sum_i fp16(g_i) / n ), cast first then divided in fp16 (PyTorch's fp16_compress_hook;
no full-size fp32 temporary). An entry above 65504 overflows to inf, as in PyTorch.
Options: none. Communication: one all-reduce per bucket, un-waited with overlap on (overlaps backward like DDP's own).
Payload per step: 2 d bytes.
"""

from __future__ import annotations

import torch

from runners.compressors._cast import CastState, cast_hook


class FP16State(CastState):
    NAME = "fp16"
    DTYPE = torch.float16
    __slots__ = ()

    def __init__(self, process_group=None) -> None:
        super().__init__(process_group)


def fp16_hook(state: FP16State, bucket):
    return cast_hook(state, bucket)


STATE = FP16State
HOOK = fp16_hook
