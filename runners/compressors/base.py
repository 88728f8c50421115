"""Shared machinery of the compressor hooks: state base class, option checks, bucket layouts, timed collectives.

Ordering rule (why every hook here is safe on gloo with many buckets): DDP calls the hook of bucket i only after it
has called the hooks of buckets 0..i-1, and it does so in the same order on every rank. Every collective a hook
needs is issued from inside the hook call itself, never from a future callback. A hook that needs one collective may
return its future un-waited (DDP's own overlap is kept); a hook that needs several dependent collectives (PowerSGD)
or that must decode before it can return (all-gather compressors) waits for each one inside the hook. So all ranks
issue all collectives in bucket order, round by round. The price: while a synchronous hook waits, backward of the
earlier layers does not run (on GPU the compute stream waits; on CPU the autograd thread blocks): the bucket's
communication is *not* overlapped with backward. The runner reports that wait as ``comm_s``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runners.timing import CommStats

# ----------------------------------------------------------------------------------------------------------------
# Option checks: one-line ValueErrors that name the value and what is accepted.


def check_int(compressor: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{compressor} {name} {value!r} is not accepted: expected an integer >= {minimum}")
    return int(value)


def check_ratio(compressor: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ValueError(f"{compressor} {name} {value!r} is outside (0, 1]")
    return float(value)


def check_nonneg(compressor: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{compressor} {name} {value!r} is not accepted: expected a number >= 0")
    return float(value)


def check_bool(compressor: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{compressor} {name} {value!r} is not accepted: expected true or false")
    return value


# ----------------------------------------------------------------------------------------------------------------
# Bucket layout


@dataclass(frozen=True)
class Layout:
    """Where each gradient of a bucket lies in its flat buffer. Matrices are views ``(shape[0], numel/shape[0])``."""

    numel: int
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(_prod(s) for s in self.shapes)

    def split(self, min_dims: int = 2):
        """(matrices, vectors): matrices as (offset, rows, cols); vectors as (offset, numel)."""
        mats, vecs = [], []
        for off, shape in zip(self.offsets, self.shapes, strict=True):
            n = _prod(shape)
            if len(shape) >= min_dims and n > 0:
                mats.append((off, shape[0], n // shape[0]))
            else:
                vecs.append((off, n))
        return mats, vecs


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def layout_of(bucket) -> Layout:
    shapes = tuple(tuple(g.shape) for g in bucket.gradients())
    offsets, off = [], 0
    for s in shapes:
        offsets.append(off)
        off += _prod(s)
    return Layout(numel=off, shapes=shapes, offsets=tuple(offsets))


class FlatBucket:
    """A stand-in for ``dist.GradBucket`` with the methods the hooks use, for serial reduction and profiling.

    ``buffer`` is the flat gradient; ``shapes`` the shapes of the gradients packed in it, in order.
    """

    def __init__(self, index: int, buffer: torch.Tensor, shapes, is_last: bool, parameters=None) -> None:
        self._index = index
        self._buffer = buffer
        self._shapes = [tuple(s) for s in shapes]
        self._is_last = is_last
        self._parameters = list(parameters) if parameters is not None else []

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor

    def is_last(self) -> bool:
        return self._is_last

    def parameters(self):
        return self._parameters

    def gradients(self):
        out, off = [], 0
        for s in self._shapes:
            n = _prod(s)
            out.append(self._buffer[off : off + n].view(s))
            off += n
        return out


# ----------------------------------------------------------------------------------------------------------------
# State base class


class CompressorState:
    """Base of every compressor state.

    Subclasses list their user hyper-parameters first in ``__slots__`` and name them in ``HYPERPARAMS``; internal
    buffers follow. ``BUFFERS`` names the slots that ``state_dict()`` saves besides the hyper-parameters and ``iter``.
    """

    NAME = "base"
    COLLECTIVE = "allreduce"
    ROUNDS = 1
    HYPERPARAMS: tuple[str, ...] = ()
    BUFFERS: tuple[str, ...] = ()

    __slots__ = ("process_group", "stats", "iter", "layouts")

    def __init__(self, process_group=None) -> None:
        self.process_group = process_group
        self.stats = CommStats()
        self.iter = 0
        self.layouts: dict[int, Layout] = {}

    # -- what the runner and launcher read
    @property
    def warmup_iters(self) -> int:
        """Iterations (counted from 0) before every step is compressed. DDP rebuilds buckets after iteration 1,
        so compressors that keep per-bucket memory need at least 2."""
        return 0

    def options(self) -> dict:
        return {k: getattr(self, k) for k in self.HYPERPARAMS}

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def payload_bytes_dense(self, numel: int, element_size: int = 4) -> int:
        return numel * element_size

    # -- iteration counting: one iteration ends with the hook of the last bucket
    def maybe_increase_iter(self, bucket) -> None:
        if bucket.is_last():
            self.iter += 1

    def layout(self, bucket) -> tuple[Layout, bool]:
        """The bucket's layout, and whether it changed since the last call (then per-bucket memory is stale)."""
        lay = layout_of(bucket)
        old = self.layouts.get(bucket.index())
        self.layouts[bucket.index()] = lay
        return lay, old is not None and old != lay

    # -- checkpointing
    def state_dict(self) -> dict:
        out = {"compressor": self.NAME, "options": self.options(), "iter": self.iter}
        for name in self.BUFFERS:
            value = getattr(self, name)
            out[name] = {k: v.detach().clone() for k, v in value.items()} if isinstance(value, dict) else value
        return out

    def load_state_dict(self, state: dict) -> None:
        if state.get("compressor") != self.NAME:
            raise ValueError(f"state_dict is for compressor {state.get('compressor')!r}, not {self.NAME!r}")
        if state["options"] != self.options():
            raise ValueError(f"{self.NAME} state_dict options {state['options']} differ from {self.options()}")
        self.iter = int(state["iter"])
        for name in self.BUFFERS:
            value = state[name]
            setattr(self, name, {k: v.clone() for k, v in value.items()} if isinstance(value, dict) else value)
        self.layouts = {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


# ----------------------------------------------------------------------------------------------------------------
# Collectives, timed. ``wait`` time is recorded as phase "comm".


def completed_future(tensor: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future(devices=[tensor.device]) if tensor.is_cuda else torch.futures.Future()
    fut.set_result(tensor)
    return fut


def allreduce_wait(state: CompressorState, tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Sum ``tensor`` over the group in place; blocks (CPU) or makes the stream wait (CUDA) until done."""
    state.stats.add_payload(index, tensor.numel() * tensor.element_size())
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    t = state.stats.start()
    work.wait()
    state.stats.stop("comm", index, t)
    return tensor


_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def allgather_wait(state: CompressorState, tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Gather ``tensor`` (1-D) from every rank into a ``(world, numel)`` tensor; waits like ``allreduce_wait``."""
    world = state.world_size
    state.stats.add_payload(index, tensor.numel() * tensor.element_size())
    out = torch.empty(world * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    work = _all_gather_single(out, tensor, group=state.process_group, async_op=True)
    t = state.stats.start()
    work.wait()
    state.stats.stop("comm", index, t)
    return out.view(world, tensor.numel())


def allreduce_mean_async(state: CompressorState, bucket) -> torch.futures.Future:
    """Plain averaged all-reduce of the bucket, returned un-waited (one collective: ordering is safe)."""
    buf = bucket.buffer()
    index = bucket.index()
    state.stats.bind(buf.device)
    buf.div_(state.world_size)
    state.stats.add_payload(index, buf.numel() * buf.element_size())
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    state.stats.end_hook()
    return fut.then(lambda f: f.value()[0])


# ----------------------------------------------------------------------------------------------------------------
# Orthogonalisation (PowerSGD, ACP-SGD)


def orthogonalize_(m: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Orthonormalise the columns of ``m`` (rows x r, r <= rows) in place: Gram-Schmidt for r <= 2, QR above."""
    r = m.shape[1]
    if r > 2 and m.dtype not in (torch.float16, torch.bfloat16):
        q, _ = torch.linalg.qr(m)
        m.copy_(q)
        return m
    for i in range(r):
        col = m[:, i : i + 1]
        col.div_(torch.linalg.vector_norm(col) + eps)
        if i + 1 < r:
            rest = m[:, i + 1 :]
            rest.sub_(col * (col.t() @ rest))
    return m


def seeded_normal(shape, seed: int, device, dtype) -> torch.Tensor:
    """Same values on every rank for the same seed (drawn on CPU, then moved)."""
    gen = torch.Generator().manual_seed(int(seed) % (2**63))
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def start_error_feedback_hook(state: CompressorState, bucket):
    """Shared start of the all-gather hooks: forget the residual of a bucket whose layout changed, and while error
    feedback warms up (DDP rebuilds its buckets after iteration 1) all-reduce densely.
    Returns (layout, future): the future is the dense all-reduce during warm-up, else None."""
    layout, changed = state.layout(bucket)
    if changed:
        state.error.pop(bucket.index(), None)
    if state.error_feedback and state.iter < state.warmup_iters:
        state.maybe_increase_iter(bucket)
        return layout, allreduce_mean_async(state, bucket)
    return layout, None
