"""Shared machinery of the compressor hooks: state base class, option checks, bucket layouts, timed collectives.

Ordering rule (why every hook here is safe on gloo with many buckets): DDP calls the hook of bucket i only after it
has called the hooks of buckets 0..i-1, and it does so in the same order on every rank. Every collective is issued
in that order on every rank, and never from a future callback (a callback runs on gloo's own thread, whenever the
previous collective of *that* rank completes, so ranks would issue collectives in different orders).

Overlap (``state.overlap``, default True; ``--overlap on|off`` of the runner):
- on: a single-collective hook issues its collective inside the hook and returns the collective's future with the
  decode chained (``fut.then(decode)``); the decode runs on gloo's callback thread and never issues a collective nor
  waits. Multi-round PowerSGD hands its bucket to one ordered communication worker per state (``CommWorker``: its
  own process group, buckets first in first out, every round issued in bucket order) and returns an un-waited
  future the worker completes. Communication then overlaps the backward of earlier layers.
- off: every collective is waited inside the hook and the decode runs there too; the hook returns a completed
  future (the earlier, blocking behaviour: the autograd thread blocks, so nothing overlaps). The runner reports that
  wait as ``comm_s``.
Both modes run the same arithmetic in the same order, so their results are bitwise equal.
"""

from __future__ import annotations

import numbers
import queue
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runners import catalog
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
    A built-in compressor's ``HYPERPARAMS``, ``COLLECTIVE`` and ``ROUNDS`` are its catalogue entry's
    (runners/catalog.py, their one home: `catalog_facts`), set when its class is made from its ``NAME``.
    """

    NAME = "base"
    COLLECTIVE = "allreduce"
    ROUNDS = 1
    OVERLAPS = True  # its communication can overlap backward (with overlap on)
    LOSSLESS = False  # gradients equal sync SGD's within TOLERANCE (testbed check-compressor checks it)
    TOLERANCE = 0.0
    HYPERPARAMS: tuple[str, ...] = ()
    BUFFERS: tuple[str, ...] = ()

    __slots__ = ("process_group", "stats", "iter", "layouts", "overlap", "worker")

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        entry = catalog.COMPRESSORS.get(cls.__dict__.get("NAME", ""))
        if entry is not None:  # a built-in: the catalogue's facts (a plugin's class declares its own)
            cls.COLLECTIVE, cls.ROUNDS = entry.collective, entry.rounds
            if "HYPERPARAMS" not in cls.__dict__:
                cls.HYPERPARAMS = entry.option_names

    def __init__(self, process_group=None) -> None:
        self.process_group = process_group
        self.stats = CommStats()
        self.iter = 0
        self.layouts: dict[int, Layout] = {}
        self.overlap = True  # set by compressors.get(..., overlap=...); not a hyper-parameter of the algorithm
        self.worker: CommWorker | None = None  # multi-round hooks only, created at the first compressed bucket

    def close(self) -> None:
        """Stop the communication worker, if any (idempotent). Call before destroying the process group; every
        job must be finished (DDP has waited for every bucket's future)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

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


def allreduce_wait(state: CompressorState, tensor: torch.Tensor, index: int, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the group in place; blocks (CPU) or makes the stream wait (CUDA) until done.
    ``group`` None: the state's process group."""
    state.stats.add_payload(index, tensor.numel() * tensor.element_size())
    state.stats.before_collective(index)
    work = dist.all_reduce(tensor, group=state.process_group if group is None else group, async_op=True)
    t = state.stats.start()
    work.wait()
    state.stats.stop("comm", index, t)
    return tensor


# the codecs' all-gather (torch's one-tensor form under either of its names); a module attribute, not a bare import,
# so that runners.profile.local_collectives can swap it for a local copy during a profile
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def allgather_wait(state: CompressorState, tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Gather ``tensor`` (1-D) from every rank into a ``(world, numel)`` tensor; waits like ``allreduce_wait``."""
    world = state.world_size
    state.stats.add_payload(index, tensor.numel() * tensor.element_size())
    out = torch.empty(world * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    state.stats.before_collective(index)
    work = all_gather_single(out, tensor, group=state.process_group, async_op=True)
    t = state.stats.start()
    work.wait()
    state.stats.stop("comm", index, t)
    return out.view(world, tensor.numel())


def allreduce_then(state: CompressorState, tensor: torch.Tensor, index: int, decode) -> torch.futures.Future:
    """Sum ``tensor`` over the group (issued now, from the hook) and return a future of ``decode(tensor)``.

    overlap on: the collective's future with ``decode`` chained; it runs on the communication thread when the
    collective completes (timed as non-critical decode), so it must neither issue a collective nor wait.
    overlap off: waits here (timed as comm), decodes here, returns a completed future."""
    stats = state.stats
    stats.add_payload(index, tensor.numel() * tensor.element_size())
    stats.before_collective(index)
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    return _finish(state, work, index, decode, tensor)


def allgather_then(state: CompressorState, tensor: torch.Tensor, index: int, decode) -> torch.futures.Future:
    """Gather ``tensor`` (1-D) from every rank into a ``(world, numel)`` tensor, issued now; returns a future of
    ``decode(gathered)``, with the same overlap rules as ``allreduce_then``."""
    world = state.world_size
    stats = state.stats
    stats.add_payload(index, tensor.numel() * tensor.element_size())
    out = torch.empty(world * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    stats.before_collective(index)
    work = all_gather_single(out, tensor, group=state.process_group, async_op=True)
    return _finish(state, work, index, decode, out.view(world, tensor.numel()))


def _finish(state: CompressorState, work, index: int, decode, result: torch.Tensor) -> torch.futures.Future:
    stats = state.stats
    if not state.overlap:
        t = stats.start()
        work.wait()
        stats.stop("comm", index, t)
        t = stats.start()
        out = decode(result)
        stats.stop("decode", index, t)
        return completed_future(out)

    def chained(fut):
        stats.collective_done(index)
        fut.value()  # completed: raises the collective's error, never blocks
        # CUDA: this runs on a stream the future took from the pool, after it waited on the collective's events;
        # DDP waits on the chained future's event recorded there. The result is used on this stream: mark it.
        record_on_current_stream(result)
        t2 = stats.start()
        out = decode(result)
        stats.stop("decode", index, t2, critical=False)
        return out

    return work.get_future().then(chained)


def record_on_current_stream(*tensors: torch.Tensor) -> None:
    """Mark CUDA tensors as used by the current stream (``record_stream``); nothing for CPU tensors."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


def allreduce_mean_async(state: CompressorState, bucket) -> torch.futures.Future:
    """Plain averaged all-reduce of the bucket, returned un-waited (one collective: ordering is safe)."""
    buf = bucket.buffer()
    index = bucket.index()
    state.stats.bind(buf.device)
    buf.div_(state.world_size)
    state.stats.add_payload(index, buf.numel() * buf.element_size())
    state.stats.before_collective(index)
    fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()
    state.stats.end_hook()
    stats = state.stats

    def done(f):
        stats.collective_done(index)
        return f.value()[0]

    return fut.then(done)


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


# ----------------------------------------------------------------------------------------------------------------
# Ordered communication worker (multi-round hooks)


class CommWorker:
    """One thread that runs bucket jobs first in, first out, on a process group of its own.

    ``group`` is created once with ``dist.new_group`` (every rank creates it at the same point: the first compressed
    bucket, in DDP's hook order), so neither DDP's collectives nor the runner's barriers can interleave with the
    worker's. Since the jobs arrive in bucket order on every rank and one thread runs them one after the other, every
    rank issues every round in bucket order. A job is ``fn()``; its result (or exception) completes the future
    ``submit`` returned. The worker blocks in ``work.wait()`` on its own thread, never in a future callback.

    CUDA (see docs/compressors.md, "Which stream each phase runs on"): the hook runs on the autograd thread with the
    backward stream current, and NCCL's ``work.wait()`` makes the *current* stream wait for the network. So the worker
    runs every job on a stream of its own (one per device), never on the hook's:
      1. ``submit`` records an event on the hook's stream after the encode it enqueued; the worker's stream waits on
         it before the job's first kernel (the rounds read what the encode wrote);
      2. every tensor that crosses (``crossing``: made on the hook's stream, used on the worker's) is marked with
         ``record_stream``, so the caching allocator never hands its memory to the hook's stream while the worker's
         kernels may still use it;
      3. the future is CUDA-aware (``devices=[device]``) and completed on the worker's stream: ``set_result`` records
         an event there (and marks the result's storage), and DDP's ``wait`` makes its stream wait on that event, as
         with PyTorch's own futures. Backward's later kernels never wait for a round.
    On CPU none of this touches ``torch.cuda``.
    """

    def __init__(self, process_group=None, device: torch.device | None = None) -> None:
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        self.group = dist.new_group(ranks=ranks)
        self.device = device
        self._streams: dict = {}  # device -> the worker's CUDA stream on it (made by the worker thread)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gc-comm-worker", daemon=True)
        self._thread.start()

    def submit(self, fn, device: torch.device, crossing=()) -> torch.futures.Future:
        """Queue ``fn``; returns the future it completes. ``crossing``: CUDA tensors the hook made (on its stream)
        that ``fn`` uses on the worker's stream."""
        if device.type != "cuda":
            fut = torch.futures.Future()
            self._jobs.put((fn, fut, None, None, ()))
            return fut
        fut = torch.futures.Future(devices=[device])
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))  # after the encode this hook enqueued
        self._jobs.put((fn, fut, device, ready, tuple(crossing)))
        return fut

    def stream(self, device: torch.device):
        """The worker's own stream on ``device`` (call from the worker thread)."""
        key = (device.type, device.index)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(device=device)
        return self._streams[key]

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            self.run_job(*item)

    def run_job(self, fn, fut, device, ready, crossing) -> None:
        """One job, on the worker thread: on CPU as is; on CUDA on the worker's stream (steps 1-3 above)."""
        try:
            if ready is None:
                fut.set_result(fn())
                return
            torch.cuda.set_device(device)
            stream = self.stream(device)
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                for t in crossing:
                    t.record_stream(stream)
                fut.set_result(fn())  # records the completion event on this (the worker's) stream
        except BaseException as e:  # the hook's future carries the error to DDP
            fut.set_exception(e)

    def close(self, timeout_s: float = 60.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout_s)
