"""bf16: cast the bucket to bfloat16, all-reduce, cast back.

Algorithm: g_avg = fp32( sum_i bf16(g_i) / n ), cast first then divided in bf16 (PyTorch's bf16_compress_hook;
no full-size fp32 temporary); bf16 keeps the fp32 exponent range with 8 bits of mantissa.
Options: none. Communication: one all-reduce per bucket, un-waited with overlap on (overlaps backward like DDP's own).
Payload per step: 2 d bytes.
"""

from __future__ import annotations

import torch

from runners.compressors._cast import CastState, cast_hook


class BF16State(CastState):
    NAME = "bf16"
    DTYPE = torch.bfloat16
    TOLERANCE = 1.6e-2  # 8 bits of mantissa
    __slots__ = ()

    def __init__(self, process_group=None) -> None:
        super().__init__(process_group)


def bf16_hook(state: BF16State, bucket):
    return cast_hook(state, bucket)


STATE = BF16State
HOOK = bf16_hook
