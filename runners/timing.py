"""Clocks and per-iteration phase accounting shared by the runner and the compressor hooks.

CPU work is timed with ``time.perf_counter``; CUDA work with CUDA events recorded on the current stream, which are
resolved (``elapsed_time``) only after the iteration's final ``torch.cuda.synchronize()``. A disabled clock returns
``None`` marks and zero durations, so ``--no-timing`` costs one attribute test per mark.
"""

from __future__ import annotations

import statistics
import time

import torch


class Clock:
    """Takes marks on one device. ``seconds(a, b)`` is valid for CUDA marks only after ``synchronize()``."""

    __slots__ = ("cuda", "enabled")

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled

    def now(self):
        if not self.enabled:
            return None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if a is None or b is None:
            return 0.0
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def last_grad_marks(module: torch.nn.Module, clock: Clock) -> list:
    """A one-element list that holds, after each backward, the clock's mark of the last gradient accumulated into
    `module`'s trainable parameters (the end of backward compute, with the hooks' waits after it); the caller may
    clear it to None before a step."""
    box: list = [None]

    def mark(_param) -> None:
        box[0] = clock.now()

    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(mark)
    return box


class CommStats:
    """What one compressor did during one iteration: timed intervals (encode, comm, decode) and payload bytes.

    Hooks call ``start()``/``stop(phase, bucket_index, mark)`` around their work and ``add_payload``; the runner calls
    ``collect()`` once per iteration (after synchronising the device) and then ``reset()``.
    ``payload_bytes`` counts what this rank hands to its collectives per step: the all-reduced tensor for an
    all-reduce, this rank's contribution for an all-gather.
    """

    __slots__ = ("clock", "intervals", "payload", "collectives", "hook_end", "hook_calls", "probe", "marks")

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.probe = None  # a SkewProbe when the runner measures peer skew (--skew-probe)
        self.reset()

    def reset(self) -> None:
        self.intervals: list[tuple[str, int, object, object, bool]] = []
        self.payload: dict[int, int] = {}
        self.collectives = 0
        self.hook_end = None
        self.hook_calls = 0
        # point marks for the timeline and the overlap split (runners/timeline.py): (kind, bucket, mark, waited)
        # with kind "ready" (DDP handed the bucket over), "returned" (the hook returned), "issue" (a collective
        # issued), "done" (it completed; waited: the training thread was blocked on it)
        self.marks: list[tuple[str, int, object, bool]] = []

    def bind(self, device: torch.device) -> Clock:
        """Use a clock for ``device`` unless the runner already set one."""
        if self.clock is None:
            self.clock = Clock(device)
        return self.clock

    def start(self):
        return self.clock.now() if self.clock is not None else None

    def stop(self, phase: str, bucket_index: int, mark, critical: bool = True) -> None:
        """End an interval begun with ``start()``. ``critical=False`` marks work done in a future callback, off
        the backward thread (it is exposed only if it runs while DDP already waits)."""
        if mark is not None:
            end = self.clock.now()
            self.intervals.append((phase, bucket_index, mark, end, critical))
            if phase == "comm":  # a wait on a collective ends when the collective is done
                self.marks.append(("done", bucket_index, end, critical))

    def mark(self, kind: str, bucket_index: int) -> None:
        """A point mark: "ready" (DDP handed the bucket to the hook), "returned" (the hook returned); taken by
        runners.timeline.marking_hook."""
        if self.clock is not None:
            self.marks.append((kind, bucket_index, self.clock.now(), False))

    def collective_done(self, bucket_index: int) -> None:
        """A collective of ``bucket_index`` that nobody waited on completed (called first thing in its future's
        callback, on the communication thread). Waited collectives are marked by ``stop("comm", ...)``."""
        if self.clock is not None:
            self.marks.append(("done", bucket_index, self.clock.now(), False))

    def intervals_with_kind(self):
        return list(self.intervals)

    def add_payload(self, bucket_index: int, nbytes: int, collectives: int = 1) -> None:
        self.payload[bucket_index] = self.payload.get(bucket_index, 0) + int(nbytes)
        self.collectives += collectives

    def before_collective(self, bucket_index: int) -> None:
        """Called right before a compressor issues a collective (same order on every rank)."""
        if self.clock is not None:
            self.marks.append(("issue", bucket_index, self.clock.now(), False))
        if self.probe is not None:
            self.probe.join(bucket_index)

    def end_hook(self) -> None:
        self.hook_calls += 1
        if self.clock is not None:
            self.hook_end = self.clock.now()

    @property
    def payload_bytes(self) -> int:
        return sum(self.payload.values())

    def collect(self) -> dict:
        """Sum the intervals per phase and per bucket. Call after the device is synchronised."""
        totals = {"encode_s": 0.0, "comm_s": 0.0, "decode_s": 0.0}
        per_bucket: dict[int, dict[str, float]] = {}
        sec = self.clock.seconds if self.clock is not None else (lambda a, b: 0.0)
        for phase, index, a, b, _critical in self.intervals:
            dt = sec(a, b)
            totals[phase + "_s"] += dt
            row = per_bucket.setdefault(index, {"encode_s": 0.0, "comm_s": 0.0, "decode_s": 0.0})
            row[phase + "_s"] += dt
        for index, nbytes in self.payload.items():
            per_bucket.setdefault(index, {"encode_s": 0.0, "comm_s": 0.0, "decode_s": 0.0})["payload_bytes"] = nbytes
        totals["payload_bytes"] = self.payload_bytes
        totals["collectives"] = self.collectives
        totals["per_bucket"] = per_bucket
        return totals


class SkewProbe:
    """Peer skew (``--skew-probe``): how long this rank's collectives waited for the slowest peer to join.

    Right before every collective a compressor issues (``CommStats.before_collective``, same order on every rank),
    this rank's wall clock is all-gathered, un-waited, on a process group of its own (one 8-byte-per-rank collective
    extra per collective; hence opt-in). ``collect()`` (once per iteration, after backward) waits for them and sums,
    per collective, ``max_j (t_j - offset_j) - (t_self - offset_self)`` clipped at 0: the time this rank was at the
    collective before the last peer arrived. ``offsets`` (seconds, per rank) correct clocks of different hosts;
    ``estimate_offsets`` measures them once at start (error about one small-message latency; ~0 on one host).
    """

    def __init__(self, group, world: int, rank: int, offsets=None, device: torch.device | str = "cpu") -> None:
        self.group = group
        self.world = world
        self.rank = rank
        self.device = torch.device(device)
        self.offsets = torch.tensor(offsets if offsets is not None else [0.0] * world, dtype=torch.float64)
        self.pending: list = []

    def join(self, bucket_index: int) -> None:
        import torch.distributed as dist

        t = time.time()
        mine = torch.tensor([t], dtype=torch.float64, device=self.device)
        out = torch.empty(self.world, dtype=torch.float64, device=self.device)
        work = dist.all_gather_into_tensor(out, mine, group=self.group, async_op=True)
        self.pending.append((out, work))

    def collect(self) -> float:
        """Sum of this rank's waits for its peers over the collectives since the last call (seconds)."""
        total = 0.0
        for out, work in self.pending:
            work.wait()
            ts = out.cpu() - self.offsets
            total += max(0.0, float(ts.max() - ts[self.rank]))
        self.pending = []
        return total


def estimate_offsets(group, world: int, rounds: int = 5, device: torch.device | str = "cpu") -> list[float]:
    """Each rank's wall-clock offset from rank 0's (seconds): after a barrier every rank samples its clock and the
    samples are all-gathered; the median over ``rounds``. Call on every rank."""
    import torch.distributed as dist

    samples = []
    for _ in range(rounds):
        dist.barrier(group=group)
        mine = torch.tensor([time.time()], dtype=torch.float64, device=torch.device(device))
        out = torch.empty(world, dtype=torch.float64, device=torch.device(device))
        dist.all_gather_into_tensor(out, mine, group=group)
        samples.append((out.cpu() - out.cpu()[0]).tolist())
    return [statistics.median(s[j] for s in samples) for j in range(world)]


def slowest_rank_steps(per_rank: list[list[float]]) -> list[float]:
    """Per step: the slowest rank's time (`per_rank[r][k]`: rank r's step k; steps all ranks have): a synchronous
    job's step time, step by step."""
    return [max(ts) for ts in zip(*per_rank, strict=False)]


def settle_ratio(steps: list[float]) -> float | None:
    """The first two steps' time over the last two's: about 1 when the steps measured a steady state, above it when
    they were still warming up (a trial's measured steps; None for fewer than 4)."""
    if len(steps) < 4 or sum(steps[-2:]) <= 0:
        return None
    return sum(steps[:2]) / sum(steps[-2:])


def lockstep_skew(per_rank: list[list[float]]) -> list[float]:
    """Per step: the slowest rank's time minus the median rank's (`per_rank[r][k]`: rank r's step k)."""
    return [max(ts) - statistics.median(ts) for ts in zip(*per_rank, strict=True)]
