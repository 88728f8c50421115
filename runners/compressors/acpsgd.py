"""acpsgd: ACP-SGD, alternate compressed PowerSGD (Zhang et al., 2023).

Algorithm, per bucket (M_j: each gradient of >= 2 dims viewed as rows x cols; E_j its local error; n ranks):
  0. Until ``start_iter`` (and for a bucket whose layout changed), plain averaged all-reduce.
  1. M_j += E_j. Matrices that fail PowerSGD's size rule, and all 1-D tensors, are sent uncompressed.
  2. P-step (even compressed steps): Q_j = orth(Q_j); P_j = M_j Q_j; E_j = M_j - P_j Q_j^T (local factors);
     ONE all-reduce of [P_1..P_k, uncompressed]; P_j /= n; M_j <- P_j Q_j^T.
     Q-step (odd steps):  P_j = orth(P_j); Q_j = M_j^T P_j; E_j = M_j - P_j Q_j^T;
     ONE all-reduce of [Q_1..Q_k, uncompressed]; Q_j /= n; M_j <- P_j Q_j^T.
  3. The averaged factor is kept for the next step (warm start); P and Q start from a seed shared by all ranks,
     so the factor that is not communicated is identical everywhere.
The step (P or Q) is decided and the error feedback updated when the hook runs; the all-reduce is issued in the
hook; the decode (divide, M <- P Q^T, factor memory) is chained on its future (overlap on) or run in the hook after
waiting (overlap off). One collective per bucket per step, never issued from a callback.
Communication: 1 all-reduce per bucket. Payload per step: 4 (sum_j rows_j r + u) bytes on P-steps,
4 (sum_j cols_j r + u) on Q-steps.
Options: rank (>= 1), start_iter (>= 2), min_compression_rate (>= 0), error_feedback, seed.
"""

import torch
import torch.distributed as dist

from runners import catalog
from runners.compressors.base import (
    CompressorState,
    allreduce_mean_async,
    allreduce_then,
    check_bool,
    check_int,
    check_nonneg,
    orthogonalize_,
    seeded_normal,
)
from runners.compressors.powersgd import low_rank_plan


class ACPSGDState(CompressorState):
    NAME = "acpsgd"
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    BUFFERS = ("error", "p_memory", "q_memory", "step")
    __slots__ = (
        *HYPERPARAMS,  # user hyper-parameters first
        # internal buffers
        "error",
        "p_memory",
        "q_memory",
        "step",
    )

    def __init__(
        self,
        process_group=None,
        rank: int = 4,
        start_iter: int = 2,
        min_compression_rate: float = 2.0,
        error_feedback: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(process_group)
        self.rank = check_int(self.NAME, "rank", rank, 1)
        self.start_iter = check_int(self.NAME, "start_iter", start_iter, 0)
        if self.start_iter < 2:
            raise ValueError(
                f"acpsgd start_iter {start_iter!r} must be >= 2 (it keeps per-bucket factors and DDP rebuilds its "
                "buckets after iteration 1)"
            )
        self.min_compression_rate = check_nonneg(self.NAME, "min_compression_rate", min_compression_rate)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.seed = check_int(self.NAME, "seed", seed, 0)
        self.error: dict[int, torch.Tensor] = {}
        self.p_memory: dict[int, torch.Tensor] = {}
        self.q_memory: dict[int, torch.Tensor] = {}
        self.step = 0  # compressed steps done: even -> P-step, odd -> Q-step

    @property
    def warmup_iters(self) -> int:
        return self.start_iter

    def plan(self, layout):
        return low_rank_plan(layout, self.rank, self.min_compression_rate)

    def maybe_increase_iter(self, bucket) -> None:
        if bucket.is_last():
            if self.iter >= self.start_iter:
                self.step += 1
            self.iter += 1


def acpsgd_hook(state: ACPSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """ACP-SGD on one bucket: one factor all-reduced, issued in the hook; decode chained on its future."""
    buf = bucket.buffer()
    index = bucket.index()
    layout, changed = state.layout(bucket)
    if changed:
        for d in (state.error, state.p_memory, state.q_memory):
            d.pop(index, None)
    if state.iter < state.start_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_mean_async(state, bucket)

    stats = state.stats
    stats.bind(buf.device)
    world = state.world_size
    comp, vecs = state.plan(layout)
    p_step = state.step % 2 == 0
    t = stats.start()
    if state.error_feedback:
        err = state.error.get(index)
        if err is not None:
            buf.add_(err)
        else:
            err = torch.zeros_like(buf)
    p_numel = sum(n * r for _, n, _, r in comp)
    q_numel = sum(m * r for _, _, m, r in comp)
    pmem = state.p_memory.get(index)
    if pmem is None or pmem.numel() != p_numel:
        pmem = seeded_normal((p_numel,), state.seed * 1_000_003 + index * 7919 + 1, buf.device, buf.dtype)
    qmem = state.q_memory.get(index)
    if qmem is None or qmem.numel() != q_numel:
        qmem = seeded_normal((q_numel,), state.seed * 1_000_003 + index * 7919 + 2, buf.device, buf.dtype)
    u_numel = sum(k for _, k in vecs)
    sent_numel = p_numel if p_step else q_numel
    cbuf = torch.empty(sent_numel + u_numel, dtype=buf.dtype, device=buf.device)
    views = []
    po = qo = 0
    for off, n, m, r in comp:
        mat = buf[off : off + n * m].view(n, m)
        if p_step:
            q = orthogonalize_(qmem[qo : qo + m * r].view(m, r))
            p = cbuf[po : po + n * r].view(n, r)
            torch.matmul(mat, q, out=p)
        else:
            p = orthogonalize_(pmem[po : po + n * r].view(n, r))
            q = cbuf[qo : qo + m * r].view(m, r)
            torch.matmul(mat.t(), p, out=q)
        if state.error_feedback:
            # E = M - P Q^T with the local factors
            torch.addmm(mat, p, q.t(), alpha=-1, out=err[off : off + n * m].view(n, m))
        views.append((mat, p, q))
        po += n * r
        qo += m * r
    uo = sent_numel
    for off, k in vecs:
        cbuf[uo : uo + k].copy_(buf[off : off + k])
        if state.error_feedback:
            err[off : off + k].zero_()  # sent exactly: no residual
        uo += k
    if state.error_feedback:
        state.error[index] = err  # complete before the collective is issued
    stats.stop("encode", index, t)

    def decode(cbuf):
        cbuf.div_(world)
        uo = sent_numel
        for off, k in vecs:
            buf[off : off + k].copy_(cbuf[uo : uo + k])
            uo += k
        for mat, p, q in views:
            torch.matmul(p, q.t(), out=mat)
        if p_step:
            state.p_memory[index] = cbuf[:p_numel]
            state.q_memory[index] = qmem
        else:
            state.q_memory[index] = cbuf[:q_numel]
            state.p_memory[index] = pmem
        return buf

    fut = allreduce_then(state, cbuf, index, decode)
    state.maybe_increase_iter(bucket)
    stats.end_hook()
    return fut


STATE = ACPSGDState
HOOK = acpsgd_hook
