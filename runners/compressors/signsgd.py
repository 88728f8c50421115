"""signsgd: signSGD with majority vote (Bernstein et al., 2019), signs bit-packed 8 per byte; optional error
feedback (EF-signSGD, Karimireddy et al., 2019).

Algorithm, per bucket (v: the flat bucket, + E when error feedback is on; T gradients in the bucket; n ranks):
  1. s = sign(v) with sign(0) = +1; per gradient t a scale a_t = mean(|v_t|) (so that SGD's learning rate keeps
     its meaning). Payload: ceil(d / 8) bytes of packed signs, padded to a multiple of 4, + 4 T bytes of scales.
  2. ONE all-gather of every rank's payload.
  3. Majority vote: g_t = sign(sum_i s_i) * mean_i(a_{i,t}) (a tie gives 0).
  4. Error feedback: E = v - a * s (what this rank's message did not carry).
Every tensor is compressed (1-D ones too: a sign per element is still well defined). The all-gather is issued in
the hook; with overlap on its future is returned with the vote (decode) chained, with overlap off it is waited there. Communication: 1 all-gather per bucket. Payload per step: 4 ceil(d_b / 32) + 4 T_b bytes per
bucket b, sent by each rank; each rank receives (n - 1) times that.
Options: error_feedback (default False: plain majority vote).
"""

import torch
import torch.distributed as dist

from runners import catalog
from runners.compressors.base import (
    CompressorState,
    allgather_then,
    check_bool,
    start_error_feedback_hook,
)

_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_signs(nonneg: torch.Tensor) -> torch.Tensor:
    """Pack a bool tensor (True = +1) into uint8, 8 per byte, most significant bit first; pads with 0 bits."""
    d = nonneg.numel()
    pad = (-d) % 8
    bits = nonneg.reshape(-1).to(torch.uint8)
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    weights = _BITS.to(bits.device)
    return (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, d: int) -> torch.Tensor:
    """Inverse of ``pack_signs`` on the last dimension: ``(..., ceil(d/8))`` uint8 -> ``(..., d)`` bool."""
    weights = _BITS.to(packed.device)
    bits = (packed.unsqueeze(-1) & weights) != 0
    return bits.reshape(*packed.shape[:-1], -1)[..., :d]


class SignSGDState(CompressorState):
    NAME = "signsgd"
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    BUFFERS = ("error",)
    __slots__ = (*HYPERPARAMS, "error", "segments")

    def __init__(self, process_group=None, error_feedback: bool = False) -> None:
        super().__init__(process_group)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.error: dict[int, torch.Tensor] = {}
        self.segments: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def warmup_iters(self) -> int:
        return 2 if self.error_feedback else 0

    def segment_ids(self, index, layout, device):
        """(per-element gradient id, per-gradient numel) of a bucket, cached."""
        cached = self.segments.get(index)
        if cached is None or cached[0].numel() != layout.numel or cached[0].device != device:
            numels = torch.tensor(layout.numels, dtype=torch.long)
            ids = torch.repeat_interleave(torch.arange(len(layout.numels)), numels)
            cached = (ids.to(device), numels.to(device))
            self.segments[index] = cached
        return cached


def signsgd_hook(state: SignSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Majority-vote signSGD on one bucket; one all-gather issued in the hook, the vote chained on it."""
    buf = bucket.buffer()
    index = bucket.index()
    layout, warmup = start_error_feedback_hook(state, bucket)
    if warmup is not None:
        return warmup
    stats = state.stats
    stats.bind(buf.device)
    d = buf.numel()
    t = stats.start()
    ids, numels = state.segment_ids(index, layout, buf.device)
    if state.error_feedback:
        err = state.error.get(index)
        if err is not None:
            buf.add_(err)
    scales = torch.zeros(len(layout.numels), dtype=torch.float32, device=buf.device)
    scales.index_add_(0, ids, buf.abs().float()).div_(numels)
    nonneg = buf >= 0
    packed = pack_signs(nonneg)
    pad = (-packed.numel()) % 4  # so the gathered rows can be viewed as fp32 for the scales
    parts = [packed, packed.new_zeros(pad), scales.view(torch.uint8)] if pad else [packed, scales.view(torch.uint8)]
    payload = torch.cat(parts)
    if state.error_feedback:
        # E = v - a * s
        sent = torch.where(nonneg, 1.0, -1.0).to(buf.dtype).mul_(scales[ids].to(buf.dtype))
        state.error[index] = buf - sent
    stats.stop("encode", index, t)
    nbytes = packed.numel()
    scale_cols = scales.numel()

    def decode(gathered):
        signs = unpack_signs(gathered[:, :nbytes], d)  # (n, d) bool
        votes = signs.sum(dim=0, dtype=torch.int32).mul_(2).sub_(signs.shape[0])  # (#plus - #minus)
        mean_scales = gathered.view(torch.float32)[:, -scale_cols:].mean(dim=0)
        return torch.mul(votes.sign().to(buf.dtype), mean_scales[ids].to(buf.dtype), out=buf)

    fut = allgather_then(state, payload, index, decode)
    state.maybe_increase_iter(bucket)
    stats.end_hook()
    return fut


STATE = SignSGDState
HOOK = signsgd_hook
