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
Steps 1-3 (encode) run in the hook. Overlap on: the hook hands the bucket to the state's ordered communication
worker (base.CommWorker: its own process group, buckets first in first out) which issues round 1, waits, computes
step 4, issues round 2, waits, decodes (5, 6) and completes the future the hook returned un-waited. Overlap off: both
rounds are issued and waited inside the hook. Either way every rank issues every round in bucket order, and never
from a future callback (PyTorch's hook does, and hangs on gloo with several buckets under rank-speed jitter).
Communication: 2 dependent all-reduces per bucket. Payload per step: 4 (sum_j (rows_j + cols_j) r + u) bytes,
u = uncompressed elements.

flavour=pytorch reproduces torch's ``powerSGD_hook`` (what Agarwal et al. ran): the uncompressed tensors get an
all-reduce of their own (issued first), Q is orthogonalised every step before P = M Q (also when warm-started),
the error is input - output over the whole bucket (so 1-D tensors keep local - average as residual), and every
round is issued even when empty: 3 all-reduces per bucket (u, P, Q; P and Q dependent). Random initial Q come from
this module's seeded generator, not torch's, so values match torch's in distribution, not bit for bit.
Options: rank (>= 1), start_iter (>= 2 when error_feedback or warm_start), min_compression_rate (>= 0),
error_feedback, warm_start, seed, flavour ("testbed" default | "pytorch").
"""

import torch
import torch.distributed as dist

from runners import catalog
from runners.compressors.base import (
    CommWorker,
    CompressorState,
    allreduce_mean_async,
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
    HYPERPARAMS = catalog.options_of(NAME)  # user hyper-parameters, collective and rounds: runners/catalog.py
    FLAVOURS = ("testbed", "pytorch")
    BUFFERS = ("error", "q_memory")
    __slots__ = (
        *HYPERPARAMS,  # user hyper-parameters first
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
        flavour: str = "testbed",
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
        if flavour not in self.FLAVOURS:
            raise ValueError(
                f"powersgd flavour {flavour!r} is not accepted: expected one of {', '.join(self.FLAVOURS)}"
            )
        self.flavour = flavour
        self.error: dict[int, torch.Tensor] = {}
        self.q_memory: dict[int, torch.Tensor] = {}

    @property
    def warmup_iters(self) -> int:
        return self.start_iter

    def plan(self, layout):
        return low_rank_plan(layout, self.rank, self.min_compression_rate)


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD on one bucket: encode here; the rounds on the ordered worker (overlap on, un-waited future) or
    waited here (overlap off, completed future)."""
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
    t = stats.start()
    job = _Job(state, buf, index, layout)
    stats.stop("encode", index, t)
    state.maybe_increase_iter(bucket)
    if not state.overlap:
        job.run(state.process_group, critical=True)
        stats.end_hook()
        return completed_future(buf)
    if state.worker is None:
        state.worker = CommWorker(state.process_group)
    group = state.worker.group
    fut = state.worker.submit(lambda: job.run(group, critical=False), buf.device, crossing=job.tensors())
    stats.end_hook()
    return fut


def _wait(state, tensor: torch.Tensor, index: int, group, critical: bool) -> None:
    """One all-reduce (sum, in place) on ``group``, waited; payload and wait time recorded."""
    stats = state.stats
    stats.add_payload(index, tensor.numel() * tensor.element_size())
    stats.before_collective(index)
    work = dist.all_reduce(tensor, group=group, async_op=True)
    t = stats.start()
    work.wait()
    stats.stop("comm", index, t, critical=critical)


class _Job:
    """One bucket's PowerSGD step: ``__init__`` is the encode (steps 1-3, in the hook), ``run`` the rounds."""

    __slots__ = ("state", "buf", "index", "inp", "ubuf", "pbuf", "qbuf", "mats", "ps", "qs", "vecs", "p_numel",
                 "q_numel")  # fmt: skip

    def __init__(self, state: PowerSGDState, buf: torch.Tensor, index: int, layout) -> None:
        self.state, self.buf, self.index = state, buf, index
        torch_flavour = state.flavour == "pytorch"
        comp, vecs = state.plan(layout)
        self.vecs = vecs
        # 1. error feedback
        self.inp = None
        if state.error_feedback:
            err = state.error.get(index)
            if err is not None:
                buf.add_(err)
            self.inp = buf.clone()
        # 3. P = M Q, packed with the uncompressed tensors (testbed) or beside them (pytorch)
        p_numel = sum(n * r for _, n, _, r in comp)
        q_numel = sum(m * r for _, _, m, r in comp)
        u_numel = sum(k for _, k in vecs)
        self.p_numel, self.q_numel = p_numel, q_numel
        self.pbuf = torch.empty(p_numel + (0 if torch_flavour else u_numel), dtype=buf.dtype, device=buf.device)
        self.ubuf = self.pbuf[p_numel:]
        if torch_flavour:
            self.ubuf = torch.empty(u_numel, dtype=buf.dtype, device=buf.device)
        qbuf = state.q_memory.get(index) if state.warm_start else None
        if qbuf is None or qbuf.numel() != q_numel:
            qbuf = seeded_normal((q_numel,), state.seed * 1_000_003 + index * 7919 + state.iter, buf.device, buf.dtype)
        self.qbuf = qbuf
        self.ps, self.qs, self.mats = [], [], []
        po = qo = 0
        for off, n, m, r in comp:
            mat = buf[off : off + n * m].view(n, m)
            p = self.pbuf[po : po + n * r].view(n, r)
            q = qbuf[qo : qo + m * r].view(m, r)
            if torch_flavour:
                orthogonalize_(q)
            torch.matmul(mat, q, out=p)
            self.ps.append(p)
            self.qs.append(q)
            self.mats.append(mat)
            po += n * r
            qo += m * r
        uo = 0
        for off, k in vecs:
            self.ubuf[uo : uo + k].copy_(buf[off : off + k])
            uo += k

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What the encode made or wrote (on the hook's stream) that the rounds use (on the worker's)."""
        out = (self.buf, self.pbuf, self.qbuf, self.ubuf) + ((self.inp,) if self.inp is not None else ())
        return tuple(t for t in out if t.is_cuda)

    def run(self, group, critical: bool) -> torch.Tensor:
        """The communication rounds and the work between them, in order; returns the averaged bucket."""
        state, buf, index = self.state, self.buf, self.index
        stats = state.stats
        world = state.world_size
        torch_flavour = state.flavour == "pytorch"
        if torch_flavour:  # round 0: the uncompressed tensors, on their own
            _wait(state, self.ubuf, index, group, critical)
        # round 1
        _wait(state, self.pbuf, index, group, critical)
        # 4. uncompressed back; orthogonalise P; Q = M^T P
        t = stats.start()
        uo = 0
        for off, k in self.vecs:
            torch.div(self.ubuf[uo : uo + k], world, out=buf[off : off + k])
            uo += k
        for mat, p, q in zip(self.mats, self.ps, self.qs, strict=True):
            orthogonalize_(p)
            torch.matmul(mat.t(), p, out=q)
        stats.stop("encode", index, t, critical=critical)
        # round 2
        if self.q_numel or torch_flavour:
            _wait(state, self.qbuf, index, group, critical)
        # 5. decompress, 6. error
        t = stats.start()
        self.qbuf.div_(world)
        for mat, p, q in zip(self.mats, self.ps, self.qs, strict=True):
            torch.matmul(p, q.t(), out=mat)
        if state.error_feedback:
            err = torch.sub(self.inp, buf, out=self.inp)
            if not torch_flavour:
                for off, k in self.vecs:
                    err[off : off + k].zero_()
            state.error[index] = err
        if state.warm_start:
            state.q_memory[index] = self.qbuf
        stats.stop("decode", index, t, critical=critical)
        return buf


STATE = PowerSGDState
HOOK = powersgd_hook
