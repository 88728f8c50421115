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

The model (testbed/perfmodel.py) charges a collective's host time k * wire bytes + gamma * reduced bytes to the
compute that runs beside it, and never lets the collective run faster than that host time.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from shaping.units import format_rate
from testbed import perfmodel as pm
from testbed.errors import InputError, why_not_a_file

CALIBRATION_SCHEMA = "testbed.calibration/1"
COLLBENCH_SCHEMA = "testbed.collbench/1"  # what runners.collbench writes (runners.contract.COLLBENCH_SCHEMA)
DEFAULT_LATENCY_S = 50e-6
DEFAULT_EFFICIENCY = 1.0


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


# --------------------------------------------------------------------------------------------- the calibration
@dataclass(frozen=True)
class Calibration:
    """A cluster's collectives measured at one shaping, and what the model takes from them."""

    cluster: str
    backend: str  # gloo | nccl
    device: str  # cpu | cuda
    world_size: int
    rate_bps: int | None  # the shaping during the measurement; None: unshaped
    threads: int
    created_at: str
    samples: tuple[CollSample, ...]
    fitted: Fitted
    contention: tuple[ContentionSample, ...] = ()
    local_reduce_s_per_byte: float | None = None
    local_copy_s_per_byte: float | None = None
    torch_version: str = ""
    path: str = field(default="", compare=False)
    lockstep_skew_samples_s: tuple[float, ...] = ()  # per lockstep step: slowest rank - median rank

    @property
    def skew_s(self) -> float:
        """How much later than the typical rank the slowest one finishes a step when the ranks start together: the
        median over the lockstep probe's steps (0 for a calibration stored before the probe existed)."""
        return statistics.median(self.lockstep_skew_samples_s) if self.lockstep_skew_samples_s else 0.0

    @property
    def efficiency(self) -> float | None:
        """B_ar / shaped rate, clamped to (0, 1]; None when calibrated unshaped (no rate to compare with)."""
        if not self.rate_bps:
            return None
        return min(1.0, max(1e-6, self.fitted.bandwidth_bps / self.rate_bps))

    @property
    def allgather_efficiency(self) -> float | None:
        """B_ag / shaped rate, clamped to (0, 1]; None when calibrated unshaped."""
        if not self.rate_bps:
            return None
        return min(1.0, max(1e-6, self.fitted.allgather_bandwidth_bps / self.rate_bps))

    def describe(self) -> str:
        at = format_rate(self.rate_bps) if self.rate_bps else "unshaped"
        name = Path(self.path).name if self.path else f"cluster {self.cluster}"
        return f"{name} ({self.backend}, {self.world_size} ranks at {at}, {self.created_at})"

    def model_terms(self) -> dict[str, float]:
        """Keyword arguments of perfmodel.Network the calibration decides (efficiency only when it was shaped)."""
        out = {
            "latency_s": self.fitted.latency_s,
            "host_s_per_wire_byte": self.fitted.host_s_per_wire_byte,
            "reduce_s_per_byte": self.fitted.reduce_s_per_byte,
            "contention_latency_s": self.fitted.contention_latency_s,
            "contention_s_per_wire_byte": self.fitted.contention_s_per_wire_byte,
            "skew_s": self.skew_s,
        }
        if self.efficiency is not None:
            out["efficiency"] = self.efficiency
            out["allgather_efficiency"] = self.allgather_efficiency
        return out


def calibration_from_bench(
    bench: Mapping[str, Any], *, cluster: str, rate_bps: int | None, created_at: str | None = None
) -> Calibration:
    """Fit a calibration to what runners.collbench wrote (schema testbed.collbench/1)."""
    if bench.get("schema") != COLLBENCH_SCHEMA:
        raise InputError(f"collective benchmark output: schema {bench.get('schema')!r}; expected {COLLBENCH_SCHEMA}")
    p = int(bench["world_size"])
    samples = tuple(
        sample(s["collective"], s["bytes"], statistics.median(s["wall_s"]), statistics.median(s["cpu_s"]), p)
        for s in bench["samples"]
    )
    contention = tuple(
        ContentionSample(
            c["collective"], int(c["bytes"]), statistics.median(c["wall_s"]), statistics.median(c["stolen_s"])
        )  # fmt: skip
        for c in bench.get("contention") or ()
    )
    lp = bench.get("local_probe") or {}
    n = lp.get("bytes") or 0
    return Calibration(
        cluster=cluster,
        backend=str(bench["backend"]),
        device=str(bench.get("device", "cpu")),
        world_size=p,
        rate_bps=int(rate_bps) if rate_bps else None,
        threads=int(bench.get("threads", 0)),
        created_at=created_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        samples=samples,
        fitted=fit_collectives(samples, p, contention),
        contention=contention,
        local_reduce_s_per_byte=lp["reduce_s"] / n if n and "reduce_s" in lp else None,
        local_copy_s_per_byte=lp["copy_s"] / n if n and "copy_s" in lp else None,
        torch_version=str(bench.get("torch_version", "")),
        lockstep_skew_samples_s=tuple(float(x) for x in (bench.get("lockstep") or {}).get("skew_s") or ()),
    )


def _fit_dict(f: LineFit) -> dict[str, float]:
    return {"intercept": f.intercept, "slope": f.slope, "rel_rms": f.rel_rms}


def calibration_to_dict(c: Calibration) -> dict[str, Any]:
    f = c.fitted
    return {
        "schema": CALIBRATION_SCHEMA,
        "cluster": c.cluster,
        "backend": c.backend,
        "device": c.device,
        "world_size": c.world_size,
        "rate_bps": c.rate_bps,
        "threads": c.threads,
        "created_at": c.created_at,
        "torch_version": c.torch_version,
        "fitted": {
            "latency_s": f.latency_s,
            "bandwidth_bps": f.bandwidth_bps,
            "allgather_bandwidth_bps": f.allgather_bandwidth_bps,
            "efficiency": c.efficiency,
            "allgather_efficiency": c.allgather_efficiency,
            "host_s_per_wire_byte": f.host_s_per_wire_byte,
            "host_source": f.host_source,
            "reduce_s_per_byte": f.reduce_s_per_byte,
            "contention_latency_s": f.contention_latency_s,
            "contention_s_per_wire_byte": f.contention_s_per_wire_byte,
            "local_reduce_s_per_byte": c.local_reduce_s_per_byte,
            "local_copy_s_per_byte": c.local_copy_s_per_byte,
            "allreduce_wall": _fit_dict(f.allreduce_fit),
            "allgather_wall": _fit_dict(f.allgather_fit),
            "allreduce_cpu": _fit_dict(f.cpu_allreduce_fit),
            "allgather_cpu": _fit_dict(f.cpu_allgather_fit),
        },
        "samples": [
            {
                "collective": s.collective,
                "bytes": s.n_bytes,
                "wall_s": s.wall_s,
                "cpu_s": s.cpu_s,
                "algbw_bps": s.algbw_bps,
                "busbw_bps": s.busbw_bps,
            }  # fmt: skip
            for s in c.samples
        ],
        "contention": [
            {"collective": s.collective, "bytes": s.n_bytes, "wall_s": s.wall_s, "stolen_s": s.stolen_s}
            for s in c.contention
        ],
        "lockstep": {"skew_s": list(c.lockstep_skew_samples_s), "median_skew_s": c.skew_s},
    }


def calibration_from_dict(d: Mapping[str, Any], source: str = "calibration") -> Calibration:
    """Read a stored calibration; the fit is recomputed from the samples (one source of truth: the equations)."""
    if not isinstance(d, Mapping) or d.get("schema") != CALIBRATION_SCHEMA:
        got = d.get("schema") if isinstance(d, Mapping) else type(d).__name__
        raise InputError(f"{source}: schema {got!r} is not supported; expected {CALIBRATION_SCHEMA!r}")
    try:
        p = int(d["world_size"])
        samples = tuple(
            CollSample(
                s["collective"],
                int(s["bytes"]),
                float(s["wall_s"]),
                float(s["cpu_s"]),
                float(s["algbw_bps"]),
                float(s["busbw_bps"]),
            )  # fmt: skip
            for s in d["samples"]
        )
        contention = tuple(
            ContentionSample(s["collective"], int(s["bytes"]), float(s["wall_s"]), float(s["stolen_s"]))
            for s in d.get("contention") or ()
        )
        fitted = d.get("fitted") or {}
        return Calibration(
            cluster=str(d["cluster"]),
            backend=str(d["backend"]),
            device=str(d.get("device", "cpu")),
            world_size=p,
            rate_bps=int(d["rate_bps"]) if d.get("rate_bps") else None,
            threads=int(d.get("threads", 0)),
            created_at=str(d.get("created_at", "")),
            samples=samples,
            fitted=fit_collectives(samples, p, contention),
            contention=contention,
            local_reduce_s_per_byte=fitted.get("local_reduce_s_per_byte"),
            local_copy_s_per_byte=fitted.get("local_copy_s_per_byte"),
            torch_version=str(d.get("torch_version", "")),
            path=source,
            lockstep_skew_samples_s=tuple(float(x) for x in (d.get("lockstep") or {}).get("skew_s") or ()),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{source}: malformed calibration ({exc!r}); expected schema {CALIBRATION_SCHEMA}") from exc


def calibration_filename(cluster: str, backend: str, world_size: int, rate_bps: int | None) -> str:
    at = format_rate(rate_bps) if rate_bps else "unshaped"
    return f"calibration-{cluster}-{backend}-p{world_size}-{at}.json"


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"calibration {path}: {why_not_a_file(path)}; expected a JSON file written by `testbed calibrate`"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"calibration {path}: not valid JSON ({exc})") from exc
    return calibration_from_dict(data, source=str(path))


def find_calibrations(directory: str | Path | None) -> list[Calibration]:
    """Every readable `calibration-*.json` in a directory (the profiles directory), unreadable ones skipped."""
    if not directory or not Path(directory).is_dir():
        return []
    out = []
    for p in sorted(Path(directory).glob("calibration-*.json")):
        try:
            out.append(load_calibration(p))
        except InputError:
            continue
    return out


def pick_calibration(
    calibrations: Iterable[Calibration], world_size: int, backend: str | None = None
) -> Calibration | None:
    """The calibration a prediction for `world_size` ranks uses: the same backend when given, then the closest world
    size, then the newest."""
    cands = [c for c in calibrations if backend is None or c.backend == backend]
    if not cands:
        return None
    return min(cands, key=lambda c: (abs(c.world_size - world_size), _neg_time(c.created_at)))


def _neg_time(created_at: str) -> float:
    try:
        return -dt.datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return 0.0


# --------------------------------------------------------------------------------------------- the model's settings
@dataclass(frozen=True)
class ModelTerms:
    """The collective terms a prediction uses and where they came from (said in predict's and report's output)."""

    latency_s: float
    efficiency: float
    host_s_per_wire_byte: float = 0.0
    reduce_s_per_byte: float = 0.0
    source: str = "defaults (no calibration)"
    allgather_efficiency: float | None = None  # None: `efficiency` for all-gather too
    contention_latency_s: float = 0.0
    contention_s_per_wire_byte: float = 0.0
    skew_s: float = 0.0

    def network(self, world_size: int, bandwidth_bps: float, extra_latency_s: float = 0.0) -> pm.Network:
        return pm.Network(
            int(world_size),
            float(bandwidth_bps),
            self.latency_s + extra_latency_s,
            self.efficiency,
            host_s_per_wire_byte=self.host_s_per_wire_byte,
            reduce_s_per_byte=self.reduce_s_per_byte,
            allgather_efficiency=self.allgather_efficiency,
            contention_latency_s=self.contention_latency_s,
            contention_s_per_wire_byte=self.contention_s_per_wire_byte,
            skew_s=self.skew_s,
        )

    def as_dict(self) -> dict[str, float | None]:
        """The terms as plain data (predict's and report's JSON)."""
        return {
            "latency_s": self.latency_s,
            "efficiency": self.efficiency,
            "allgather_efficiency": self.allgather_efficiency,
            "host_s_per_wire_byte": self.host_s_per_wire_byte,
            "reduce_s_per_byte": self.reduce_s_per_byte,
            "contention_latency_s": self.contention_latency_s,
            "contention_s_per_wire_byte": self.contention_s_per_wire_byte,
            "skew_s": self.skew_s,
        }

    def describe_terms(self) -> str:
        host = (
            f", host cost {self.host_s_per_wire_byte * 1e9:.3g} ns/B on the wire + "
            f"{self.reduce_s_per_byte * 1e9:.3g} ns/B reduced"
            if self.host_s_per_wire_byte or self.reduce_s_per_byte
            else ", no host cost"
        )
        ag = f" (all-gather {self.allgather_efficiency:.3g})" if self.allgather_efficiency is not None else ""
        busy = (
            f", beside compute +{self.contention_latency_s * 1e6:.3g} us per step and "
            f"+{self.contention_s_per_wire_byte * 1e9:.3g} ns/B on the wire"
            if self.contention_latency_s or self.contention_s_per_wire_byte
            else ""
        )
        skew = f", slowest rank {self.skew_s * 1e3:.3g} ms late in lockstep" if self.skew_s else ""
        return f"latency {self.latency_s * 1e6:.3g} us, efficiency {self.efficiency:.3g}{ag}{host}{busy}{skew}"

    def describe(self) -> str:
        return f"{self.describe_terms()}; {self.source}"

    def function(self, world_size: int, extra_latency_s: float = 0.0) -> pm.Network:
        """The terms as perfmodel.Terms (the same at every bandwidth)."""
        return self.network(world_size, 1.0, extra_latency_s)


def model_terms(
    calibration: Calibration | None, *, latency_s: float | None = None, efficiency: float | None = None
) -> ModelTerms:
    """The terms from a calibration, with explicitly given latency / efficiency overriding it; without a calibration
    the defaults (50 us, 1.0, no host cost), and the source says so."""
    if calibration is None:
        return ModelTerms(
            DEFAULT_LATENCY_S if latency_s is None else latency_s,
            DEFAULT_EFFICIENCY if efficiency is None else efficiency,
            source="defaults (no calibration: run `testbed calibrate`)",
        )
    terms = calibration.model_terms()
    src = f"calibration {calibration.describe()}"
    overrides = [n for n, v in (("latency", latency_s), ("efficiency", efficiency)) if v is not None]
    if overrides:
        src += f"; {' and '.join(overrides)} given on the command line"
    return ModelTerms(
        terms["latency_s"] if latency_s is None else latency_s,
        (terms.get("efficiency", DEFAULT_EFFICIENCY) if efficiency is None else efficiency),
        terms["host_s_per_wire_byte"],
        terms["reduce_s_per_byte"],
        src,
        terms.get("allgather_efficiency") if efficiency is None else None,
        terms["contention_latency_s"],
        terms["contention_s_per_wire_byte"],
        terms["skew_s"],
    )


# --------------------------------------------------------------------------------------------- several rates
def calibrated_rate_bps(c: Calibration) -> float:
    """Where a calibration sits on the rate axis: its shaped rate, or for one measured unshaped the all-reduce
    bandwidth it reached (what an unshaped link gives the collectives)."""
    return float(c.rate_bps) if c.rate_bps else float(c.fitted.bandwidth_bps)


_INTERPOLATED = (
    "latency_s",
    "host_s_per_wire_byte",
    "reduce_s_per_byte",
    "contention_latency_s",
    "contention_s_per_wire_byte",
    "skew_s",
)


def _interpolate(points: Sequence[tuple[float, float]], rate_bps: float) -> float:
    """Linear in log(rate) between the two points around `rate_bps`; the nearest point's value outside them."""
    if rate_bps <= points[0][0]:
        return points[0][1]
    if rate_bps >= points[-1][0]:
        return points[-1][1]
    for (r0, v0), (r1, v1) in zip(points, points[1:], strict=False):
        if r0 <= rate_bps <= r1:
            frac = math.log(rate_bps / r0) / math.log(r1 / r0)
            return v0 + frac * (v1 - v0)
    raise AssertionError("unreachable: rate inside the points' range")


@dataclass(frozen=True)
class TermsByRate:
    """The collective terms of calibrations at several rates (one world size and backend): at a bandwidth, each term
    interpolated linearly in log(rate) between the two calibrations around it, the nearest one's outside their
    range. The efficiency (a fraction of a shaped rate) comes from the shaped calibrations only, the other terms
    from all of them (an unshaped one at the all-reduce bandwidth it reached). Latency / efficiency given on the
    command line override every point."""

    calibrations: tuple[Calibration, ...]  # ascending calibrated_rate_bps, one per rate
    latency_s: float | None = None
    efficiency: float | None = None

    def __post_init__(self) -> None:
        if len(self.calibrations) < 2:
            raise ValueError("TermsByRate needs calibrations at two or more rates")

    @cached_property
    def _points(self) -> tuple[list[float], list[dict[str, float]]]:
        """Each calibration's rate and terms, computed once (a curve or crossover asks at many bandwidths)."""
        return [calibrated_rate_bps(c) for c in self.calibrations], [c.model_terms() for c in self.calibrations]

    def at(self, bandwidth_bps: float) -> ModelTerms:
        """The terms at `bandwidth_bps`."""
        rates, terms = self._points
        values = {n: _interpolate([(r, t[n]) for r, t in zip(rates, terms, strict=True)], bandwidth_bps)
                  for n in _INTERPOLATED}  # fmt: skip
        shaped = [(r, c) for r, c in zip(rates, self.calibrations, strict=True) if c.efficiency is not None]
        eff = ag_eff = None
        if shaped:
            eff = _interpolate([(r, c.efficiency) for r, c in shaped], bandwidth_bps)
            ag_eff = _interpolate([(r, c.allgather_efficiency) for r, c in shaped], bandwidth_bps)
        return ModelTerms(
            values["latency_s"] if self.latency_s is None else self.latency_s,
            (eff if eff is not None else DEFAULT_EFFICIENCY) if self.efficiency is None else self.efficiency,
            values["host_s_per_wire_byte"],
            values["reduce_s_per_byte"],
            self.source,
            ag_eff if self.efficiency is None else None,
            values["contention_latency_s"],
            values["contention_s_per_wire_byte"],
            values["skew_s"],
        )

    def network(self, world_size: int, bandwidth_bps: float, extra_latency_s: float = 0.0) -> pm.Network:
        return self.at(bandwidth_bps).network(world_size, bandwidth_bps, extra_latency_s)

    def function(self, world_size: int, extra_latency_s: float = 0.0):
        """The terms as perfmodel.Terms: a function of the bandwidth (for curves and crossovers)."""
        return lambda bandwidth_bps: self.network(world_size, bandwidth_bps, extra_latency_s)

    @property
    def source(self) -> str:
        src = "calibrations " + ", ".join(c.describe() for c in self.calibrations) + ", interpolated by rate"
        overrides = [n for n, v in (("latency", self.latency_s), ("efficiency", self.efficiency)) if v is not None]
        if overrides:
            src += f"; {' and '.join(overrides)} given on the command line"
        return src

    def as_dict(self) -> dict[str, Any]:
        """Each calibration's terms by the rate it sits at (predict's and report's JSON)."""
        return {
            "interpolated_by_rate": [
                {"rate_bps": calibrated_rate_bps(c), **self.at(calibrated_rate_bps(c)).as_dict()}
                for c in self.calibrations
            ]
        }

    def describe(self) -> str:
        parts = [
            f"at {format_rate(int(calibrated_rate_bps(c)))}: {self.at(calibrated_rate_bps(c)).describe_terms()}"
            for c in self.calibrations
        ]
        return "; ".join(parts) + f"; {self.source}"


def pick_calibrations(
    calibrations: Iterable[Calibration], world_size: int, backend: str | None = None
) -> list[Calibration]:
    """The calibrations a prediction for `world_size` ranks interpolates between: the same backend when given, the
    closest world size, the newest one at each rate; ascending by calibrated_rate_bps."""
    calibrations = list(calibrations)
    first = pick_calibration(calibrations, world_size, backend)
    if first is None:
        return []
    same = [c for c in calibrations if c.backend == first.backend and c.world_size == first.world_size]
    newest: dict[int | None, Calibration] = {}
    for c in sorted(same, key=lambda c: _neg_time(c.created_at)):
        newest.setdefault(c.rate_bps, c)
    return sorted(newest.values(), key=calibrated_rate_bps)


def terms_for(
    calibrations: Iterable[Calibration],
    world_size: int,
    *,
    backend: str | None = None,
    latency_s: float | None = None,
    efficiency: float | None = None,
) -> ModelTerms | TermsByRate:
    """The terms a prediction for `world_size` ranks uses: one calibration's (model_terms; the defaults without any),
    or, with calibrations at several rates, those interpolated by rate."""
    picked = pick_calibrations(list(calibrations), world_size, backend)
    if len(picked) < 2:
        return model_terms(picked[0] if picked else None, latency_s=latency_s, efficiency=efficiency)
    return TermsByRate(tuple(picked), latency_s, efficiency)
