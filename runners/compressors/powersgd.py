"""powersgd: rank-r PowerSGD with error feedback and warm start (Vogels et al., NeurIPS 2019).

Algorithm, per bucket (M_j: each gradient of >= 2 dims viewed as rows x cols, n: world size, r: rank):
  0. Until ``start_iter`` (and for a bucket whose layout changed), plain averaged all-reduce.
  1. Add the error feedback: M_j += E_j (local). Keep a copy of the input when error feedback is on.
  2. Only matrices with (rows + cols) * r * min_compression_rate < rows * cols are compressed (PyTorch's rule);
     the others (and all 1-D tensors: biases, norms) are sent uncompressed.
  3. P_j = M_j Q_j (Q_j: the previous step's Q when warm start, else fresh; both drawn from a seed shared by all
     ranks). Round 1: ONE all-reduce of [P_1..P_k, uncompressed tensors].
  4. Uncompressed tensors <- sum / n. P_j <- orthonormal(P_j). Q_j = M_j^T P_j. Round 2: all-reduce [Q_1..Q_k].
  5. Q_j /= n; M_j <- P_j Q_j^T (the average approximation, same on every rank).
  6. Error feedback: E_j = input_j - P_j Q_j^T for compressed matrices (0 for uncompressed tensors).
Both rounds are issued and waited inside the hook (see base.py for why): never from a future callback.
Communication: 2 dependent all-reduces per bucket. Payload per step: 4 (sum_j (rows_j + cols_j) r + u) bytes,
u = uncompressed elements.
Options: rank (>= 1), start_iter (>= 2 when error_feedback or warm_start), min_compression_rate (>= 0),
error_feedback, warm_start, seed.
"""

import torch
import torch.distributed as dist

from runners.compressors.base import (
    CompressorState,
    allreduce_mean_async,
    allreduce_wait,
    check_bool,
    check_int,
    check_nonneg,
    completed_future,
    orthogonalize_,
    seeded_normal,
)


def low_rank_plan(layout, rank: int, min_compression_rate: float):
    """(compressed matrices as (offset, rows, cols, r), uncompressed as (offset, numel)) for a bucket; shared by
    PowerSGD and ACP-SGD."""
    mats, vecs = layout.split()
    comp = []
    for off, n, m in mats:
        r = min(rank, n, m)
        if should_compress(n, m, r, min_compression_rate):
            comp.append((off, n, m, r))
        else:
            vecs.append((off, n * m))
    vecs.sort()
    return comp, vecs


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: compress when the factors are at least ``min_compression_rate`` times smaller."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


class PowerSGDState(CompressorState):
    NAME = "powersgd"
    COLLECTIVE = "allreduce"
    ROUNDS = 2
    HYPERPARAMS = ("rank", "start_iter", "min_compression_rate", "error_feedback", "warm_start", "seed")
    BUFFERS = ("error", "q_memory")
    __slots__ = (
        # user hyper-parameters
        "rank",
        "start_iter",
        "min_compression_rate",
        "error_feedback",
        "warm_start",
        "seed",
        # internal buffers, per bucket index
        "error",
        "q_memory",
    )

    def __init__(
        self,
        process_group=None,
        rank: int = 4,
        start_iter: int = 2,
        min_compression_rate: float = 2.0,
        error_feedback: bool = True,
        warm_start: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(process_group)
        self.rank = check_int(self.NAME, "rank", rank, 1)
        self.error_feedback = check_bool(self.NAME, "error_feedback", error_feedback)
        self.warm_start = check_bool(self.NAME, "warm_start", warm_start)
        need = 2 if (self.error_feedback or self.warm_start) else 0
        self.start_iter = check_int(self.NAME, "start_iter", start_iter, 0)
        if self.start_iter < need:
            raise ValueError(
                f"powersgd start_iter {start_iter!r} must be >= 2 when error_feedback or warm_start is on "
                "(DDP rebuilds its buckets after iteration 1)"
            )
        self.min_compression_rate = check_nonneg(self.NAME, "min_compression_rate", min_compression_rate)
        self.seed = check_int(self.NAME, "seed", seed, 0)
        self.error: dict[int, torch.Tensor] = {}
        self.q_memory: dict[int, torch.Tensor] = {}

    @property
    def warmup_iters(self) -> int:
        return self.start_iter

    def plan(self, layout):
        return low_rank_plan(layout, self.rank, self.min_compression_rate)


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD on one bucket, both rounds waited inside the hook. Returns a completed future."""
    buf = bucket.buffer()
    index = bucket.index()
    layout, changed = state.layout(bucket)
    if changed:
        state.error.pop(index, None)
        state.q_memory.pop(index, None)
    if state.iter < state.start_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_mean_async(state, bucket)

    stats = state.stats
    stats.bind(buf.device)
    world = state.world_size
    comp, vecs = state.plan(layout)
    t = stats.start()
    # 1. error feedback
    if state.error_feedback:
        err = state.error.get(index)
        if err is not None:
            buf.add_(err)
        inp = buf.clone()
    # 3. P = M Q, packed with the uncompressed tensors
    p_numel = sum(n * r for _, n, _, r in comp)
    q_numel = sum(m * r for _, _, m, r in comp)
    u_numel = sum(k for _, k in vecs)
    pbuf = torch.empty(p_numel + u_numel, dtype=buf.dtype, device=buf.device)
    qbuf = state.q_memory.get(index) if state.warm_start else None
    if qbuf is None or qbuf.numel() != q_numel:
        qbuf = seeded_normal((q_numel,), state.seed * 1_000_003 + index * 7919 + state.iter, buf.device, buf.dtype)
    ps, qs, mats = [], [], []
    po = qo = 0
    for off, n, m, r in comp:
        mat = buf[off : off + n * m].view(n, m)
        p = pbuf[po : po + n * r].view(n, r)
        q = qbuf[qo : qo + m * r].view(m, r)
        torch.matmul(mat, q, out=p)
        ps.append(p)
        qs.append(q)
        mats.append(mat)
        po += n * r
        qo += m * r
    uo = p_numel
    for off, k in vecs:
        pbuf[uo : uo + k].copy_(buf[off : off + k])
        uo += k
    stats.stop("encode", index, t)
    # round 1
    allreduce_wait(state, pbuf, index)
    # 4. uncompressed back; orthogonalise P; Q = M^T P
    t = stats.start()
    uo = p_numel
    for off, k in vecs:
        torch.div(pbuf[uo : uo + k], world, out=buf[off : off + k])
        uo += k
    for mat, p, q in zip(mats, ps, qs, strict=True):
        orthogonalize_(p)
        torch.matmul(mat.t(), p, out=q)
    stats.stop("encode", index, t)
    # round 2
    if q_numel:
        allreduce_wait(state, qbuf, index)
    # 5. decompress, 6. error
    t = stats.start()
    qbuf.div_(world)
    for mat, p, q in zip(mats, ps, qs, strict=True):
        torch.matmul(p, q.t(), out=mat)
    if state.error_feedback:
        err = torch.sub(inp, buf, out=inp)
        for off, k in vecs:
            err[off : off + k].zero_()
        state.error[index] = err
    if state.warm_start:
        state.q_memory[index] = qbuf
    stats.stop("decode", index, t)
    state.maybe_increase_iter(bucket)
    stats.end_hook()
    return completed_future(buf)


STATE = PowerSGDState
HOOK = powersgd_hook
