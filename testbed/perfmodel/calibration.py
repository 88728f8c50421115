"""A calibration: a cluster's collectives measured at one shaping (`testbed calibrate`, testbed/calibrate.py runs the
microbenchmark), the fit of them (perfmodel/fit.py), its `testbed.calibration/1` JSON beside the profiles, and
which one a prediction uses. Pure, torch-free."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shaping.files import atomic_write
from shaping.units import rate_or_unshaped
from testbed.errors import InputError, why_not_a_file
from testbed.perfmodel.fit import CollSample, ContentionSample, Fitted, LineFit, fit_collectives, sample

CALIBRATION_SCHEMA = "testbed.calibration/1"
COLLBENCH_SCHEMA = "testbed.collbench/1"  # what runners.collbench writes (runners.contract.COLLBENCH_SCHEMA)


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
    # bulk TCP flows that shared the links while it measured (`testbed calibrate --cross-traffic N`, issue 36); only
    # predictions of trials with that much cross traffic use it (pick_calibration)
    cross_traffic: int = 0

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
        at = rate_or_unshaped(self.rate_bps)
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
    bench: Mapping[str, Any],
    *,
    cluster: str,
    rate_bps: int | None,
    created_at: str | None = None,
    cross_traffic: int = 0,
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
        cross_traffic=int(cross_traffic),
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
        "cross_traffic": c.cross_traffic,
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
            cross_traffic=int(d.get("cross_traffic") or 0),  # older calibrations: measured without
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


def calibration_filename(
    cluster: str, backend: str, world_size: int, rate_bps: int | None, cross_traffic: int = 0
) -> str:
    at = rate_or_unshaped(rate_bps)
    beside = f"-x{cross_traffic}" if cross_traffic else ""  # measured beside N cross-traffic flows
    return f"calibration-{cluster}-{backend}-p{world_size}-{at}{beside}.json"


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
    calibrations: Iterable[Calibration], world_size: int, backend: str | None = None, cross_traffic: int = 0
) -> Calibration | None:
    """The calibration a prediction for `world_size` ranks uses: one measured beside as many cross-traffic flows as
    the trial had (none, unless asked), the same backend when given, then the closest world size, then the newest."""
    cands = [c for c in calibrations
             if c.cross_traffic == cross_traffic and (backend is None or c.backend == backend)]  # fmt: skip
    if not cands:
        return None
    return min(cands, key=lambda c: (abs(c.world_size - world_size), newest_first_key(c.created_at)))


def newest_first_key(created_at: str) -> float:
    try:
        return -dt.datetime.fromisoformat(created_at).timestamp()
    except ValueError:
        return 0.0


def save_calibration(calibration: Calibration, directory: str | Path) -> Path:
    """Write the calibration JSON atomically beside the profiles; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = calibration_filename(calibration.cluster, calibration.backend, calibration.world_size, calibration.rate_bps,
                                calibration.cross_traffic)  # fmt: skip
    return atomic_write(directory / name, json.dumps(calibration_to_dict(calibration), indent=2) + "\n")
