"""Calibration of the performance model from a cluster's own collectives: the fit (pure functions), the stored JSON
and the choice of calibration a prediction uses. Torch-free; `testbed/calibrate.py` runs the microbenchmark.

Inputs: per collective and message size n (bytes; for all-gather the *output*, n / p from each of p ranks, as
nccl-tests counts it) the median wall time of the slowest rank and the mean CPU time a rank's process spent.

The fit (`fit_line`: slope from the large messages, intercept from the small ones, as one reads nccl-tests):

    all-reduce wall  T_ar(n) = 2(p-1) alpha + 2(p-1)/p * 8n / B_ar
    all-gather wall  T_ag(n) =  (p-1) alpha +  (p-1)/p * 8n / B_ag
        alpha = intercept_ar / (2(p-1))          latency per message step (clamped >= 0)
        B_ar  = 2(p-1)/p * 8 / slope_ar          effective bandwidth (bits/s) of all-reduce; B_ag likewise
        efficiency eta = B_ar / rate             when calibrated at a shaped rate (clamped to (0, 1])

    host time per byte s_ar, s_ag: from the contention probe (compute each collective of a back-to-back stream takes
    from CNN training steps running beside it on the rank, `stolen_s`, the median over repetitions; per byte: the
    median of stolen_s / n over the probed sizes); without one, from the
    slope of the process CPU time (which misses the kernel's socket work done outside the process).
        a rank sends (and receives) 2(p-1)/p n bytes in an all-reduce and reduces (p-1)/p n of them;
        in an all-gather it sends (p-1)/p n and reduces nothing. So
        k     = s_ag / ((p-1)/p)                 host seconds per byte on the wire (copies, socket stack)
        gamma = (s_ar - 2(p-1)/p k) / ((p-1)/p)  host seconds per byte reduced (clamped >= 0)
    The local probe (``x.add_(y)`` on one rank, no network) gives gamma_local, a cross-check of gamma.

The performance model (perfmodel/collectives.py) charges a collective's host time k * wire bytes + gamma * reduced bytes to the
compute that runs beside it, and never lets the collective run faster than that host time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.errors import InputError


# --------------------------------------------------------------------------------------------- the fit
@dataclass(frozen=True)
class LineFit:
    """y = intercept + slope * x; `rel_rms` the root mean square of the relative residuals."""

    intercept: float
    slope: float
    rel_rms: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LineFit:
    """y = a + b x the way nccl-tests reads its table: the slope b from the large messages, the intercept a from the
    small ones, so neither end's noise leaks into the other (a shaper's burst lets a small message through at line
    rate; a 5 % wobble of a large message's time is larger than the whole latency).

        b = least-squares slope over the upper half of the distinct sizes (all of them when there are 2 or 3)
        a = median over the lower half of (y_i - b x_i)
    Repeated sizes are averaged first."""
    pts: dict[float, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        if y > 0 and math.isfinite(y):
            pts.setdefault(float(x), []).append(float(y))
    if len(pts) < 2:
        raise InputError("cannot fit a line: need positive times at two or more distinct message sizes")
    xy = sorted((x, statistics.fmean(v)) for x, v in pts.items())
    n = len(xy)
    upper = xy if n <= 3 else xy[n // 2 :]
    lower = xy if n <= 3 else xy[: (n + 1) // 2]
    mx = statistics.fmean(x for x, _ in upper)
    my = statistics.fmean(y for _, y in upper)
    slope = sum((x - mx) * (y - my) for x, y in upper) / sum((x - mx) ** 2 for x, _ in upper)
    intercept = statistics.median(y - slope * x for x, y in lower)
    rms = math.sqrt(statistics.fmean(((intercept + slope * x - y) / y) ** 2 for x, y in xy))
    return LineFit(intercept, slope, rms)


@dataclass(frozen=True)
class CollSample:
    """One collective at one message size: medians over repetitions; nccl-tests' algbw and busbw."""

    collective: str
    n_bytes: int
    wall_s: float
    cpu_s: float
    algbw_bps: float
    busbw_bps: float


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw (nccl-tests): 2(p-1)/p for all-reduce, (p-1)/p for all-gather."""
    p = world_size
    return 2 * (p - 1) / p if collective == "allreduce" else (p - 1) / p


def sample(collective: str, n_bytes: int, wall_s: float, cpu_s: float, world_size: int) -> CollSample:
    algbw = 8.0 * n_bytes / wall_s if wall_s > 0 else math.inf
    return CollSample(collective, int(n_bytes), wall_s, cpu_s, algbw, algbw * bus_factor(collective, world_size))


@dataclass(frozen=True)
class ContentionSample:
    """A collective run beside compute: its wall time (median) and the compute it took from the rank (least)."""

    collective: str
    n_bytes: int
    wall_s: float
    stolen_s: float


@dataclass(frozen=True)
class Fitted:
    """What the fit gives the model (see the module docstring for the equations)."""

    latency_s: float
    bandwidth_bps: float  # all-reduce's effective bandwidth B_ar
    allgather_bandwidth_bps: float
    host_s_per_wire_byte: float  # k
    reduce_s_per_byte: float  # gamma
    host_source: str  # "contention probe" | "process CPU time"
    allreduce_fit: LineFit
    allgather_fit: LineFit
    cpu_allreduce_fit: LineFit
    cpu_allgather_fit: LineFit
    contention_latency_s: float = 0.0  # c_lat: what compute beside a collective adds per latency step
    contention_s_per_wire_byte: float = 0.0  # c_byte: ... and per byte a rank sends


def host_per_byte(contention: Sequence[ContentionSample], collective: str) -> float | None:
    """stolen_s / n of one collective's contention samples at their largest size (a small message's stolen time is
    per message, not per byte); None without samples."""
    mine = [c for c in contention if c.collective == collective and c.n_bytes > 0]
    if not mine:
        return None
    top = max(c.n_bytes for c in mine)
    return statistics.median(c.stolen_s / c.n_bytes for c in mine if c.n_bytes == top)


def contention_terms(
    contention: Sequence[ContentionSample], ar: LineFit, ag: LineFit, world_size: int
) -> tuple[float, float]:
    """(c_lat, c_byte): the line through each collective's wall times beside compute (two or more sizes) against
    its line alone; intercept and slope differences per latency step and per wire byte, the two collectives averaged
    and clamped >= 0. (0, 0) when the probe ran at fewer than two sizes."""
    p = world_size
    lat, byte = [], []
    for name, idle, steps, wire in (("allreduce", ar, 2 * (p - 1), 2 * (p - 1) / p), ("allgather", ag, p - 1, (p - 1) / p)):
        mine = [c for c in contention if c.collective == name]
        if len({c.n_bytes for c in mine}) < 2:
            return 0.0, 0.0
        loaded = fit_line([c.n_bytes for c in mine], [c.wall_s for c in mine])
        lat.append((loaded.intercept - idle.intercept) / steps)
        byte.append((loaded.slope - idle.slope) / wire)
    return max(0.0, statistics.fmean(lat)), max(0.0, statistics.fmean(byte))


def fit_collectives(
    samples: Sequence[CollSample], world_size: int, contention: Sequence[ContentionSample] = ()
) -> Fitted:
    """alpha, B_ar, B_ag, k and gamma from samples of both collectives at two or more sizes each."""
    p = world_size
    if p < 2:
        raise InputError(f"world size {p}: a calibration needs at least 2 ranks")
    by = {c: [s for s in samples if s.collective == c] for c in ("allreduce", "allgather")}
    for c, ss in by.items():
        if len({s.n_bytes for s in ss}) < 2:
            raise InputError(f"calibration: {c} measured at fewer than 2 message sizes; give at least 2 sizes")
    ar = fit_line([s.n_bytes for s in by["allreduce"]], [s.wall_s for s in by["allreduce"]])
    ag = fit_line([s.n_bytes for s in by["allgather"]], [s.wall_s for s in by["allgather"]])
    if ar.slope <= 0 or ag.slope <= 0:
        raise InputError(
            "calibration: time does not grow with message size (noise larger than the transfer); "
            "use larger --sizes or more --reps"
        )
    f = (p - 1) / p
    cpu_ar = fit_line([s.n_bytes for s in by["allreduce"]], [max(s.cpu_s, 1e-9) for s in by["allreduce"]])
    cpu_ag = fit_line([s.n_bytes for s in by["allgather"]], [max(s.cpu_s, 1e-9) for s in by["allgather"]])
    s_ar, s_ag = host_per_byte(contention, "allreduce"), host_per_byte(contention, "allgather")
    source = "contention probe"
    if s_ar is None or s_ag is None:
        s_ar, s_ag, source = cpu_ar.slope, cpu_ag.slope, "process CPU time"
    k = max(0.0, s_ag / f)
    gamma = max(0.0, (s_ar - 2 * f * k) / f)
    c_lat, c_byte = contention_terms(contention, ar, ag, p)
    return Fitted(
        latency_s=max(0.0, ar.intercept / (2 * (p - 1))),
        bandwidth_bps=2 * f * 8.0 / ar.slope,
        allgather_bandwidth_bps=f * 8.0 / ag.slope,
        host_s_per_wire_byte=k,
        reduce_s_per_byte=gamma,
        host_source=source,
        allreduce_fit=ar,
        allgather_fit=ag,
        cpu_allreduce_fit=cpu_ar,
        cpu_allgather_fit=cpu_ag,
        contention_latency_s=c_lat,
        contention_s_per_wire_byte=c_byte,
    )



def fit_efficiency(predicted_comm_s: Sequence[float], measured_comm_s: Sequence[float]) -> float:
    """Efficiency that makes the model's bandwidth-bound communication time match measurement (median ratio).

    Pass communication times predicted at efficiency 1.0 (and no latency) and the measured ones of the same
    trials. The result is clamped to (0, 1].
    """
    ratios = sorted(p / m for p, m in zip(predicted_comm_s, measured_comm_s, strict=True) if m > 0 and p > 0)
    if not ratios:
        raise InputError("cannot fit efficiency: no trial with positive predicted and measured communication time")
    n = len(ratios)
    med = ratios[n // 2] if n % 2 else 0.5 * (ratios[n // 2 - 1] + ratios[n // 2])
    return min(1.0, max(1e-6, med))
