"""Clocks and per-iteration phase accounting shared by the runner and the compressor hooks.

CPU work is timed with ``time.perf_counter``; CUDA work with CUDA events recorded on the current stream, which are
resolved (``elapsed_time``) only after the iteration's final ``torch.cuda.synchronize()``. A disabled clock returns
``None`` marks and zero durations, so ``--no-timing`` costs one attribute test per mark.
"""

from __future__ import annotations

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


class CommStats:
    """What one compressor did during one iteration: timed intervals (encode, comm, decode) and payload bytes.

    Hooks call ``start()``/``stop(phase, bucket_index, mark)`` around their work and ``add_payload``; the runner calls
    ``collect()`` once per iteration (after synchronising the device) and then ``reset()``.
    ``payload_bytes`` counts what this rank hands to its collectives per step: the all-reduced tensor for an
    all-reduce, this rank's contribution for an all-gather.
    """

    __slots__ = ("clock", "intervals", "payload", "collectives", "hook_end", "hook_calls", "probe")

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
            self.intervals.append((phase, bucket_index, mark, self.clock.now(), critical))

    def intervals_with_kind(self):
        return list(self.intervals)

    def add_payload(self, bucket_index: int, nbytes: int, collectives: int = 1) -> None:
        self.payload[bucket_index] = self.payload.get(bucket_index, 0) + int(nbytes)
        self.collectives += collectives

    def before_collective(self, bucket_index: int) -> None:
        """Called right before a compressor issues a collective (same order on every rank)."""
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
