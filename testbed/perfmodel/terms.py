"""The collective terms a prediction uses (latency, efficiency, host and contention costs, lockstep skew) and where
they came from: one calibration's (`model_terms`; the defaults without one), or several rates' interpolated by
rate (`TermsByRate`); `terms_for` picks between them. `Network` (perfmodel/collectives.py) carries them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shaping.units import format_rate
from testbed.perfmodel.calibration import Calibration, newest_first_key, pick_calibration
from testbed.perfmodel.collectives import Network

DEFAULT_LATENCY_S = 50e-6
DEFAULT_EFFICIENCY = 1.0


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
    # the collectives' relative uncertainty (the calibration fit's residual, the larger collective's): a prediction's
    # interval; and the rate the calibration sits at (a prediction elsewhere is extrapolated)
    comm_rel_spread: float = 0.0
    calibrated_rates_bps: tuple[float, ...] = ()
    calibrated_unshaped: bool = False  # measured on unshaped links: every rate above it is what it measured

    def extrapolated(self, bandwidth_bps: float) -> bool:
        """Whether `bandwidth_bps` lies outside the calibrated rates (by more than 10 %); False without any."""
        return is_extrapolated(self.calibrated_rates_bps, bandwidth_bps, open_above=self.calibrated_unshaped)

    @property
    def unshaped_rate_bps(self) -> float | None:
        """The rate an unshaped link stands at: the all-reduce bandwidth the unshaped calibration reached (None
        without one)."""
        return self.calibrated_rates_bps[0] if self.calibrated_unshaped and self.calibrated_rates_bps else None

    def network(self, world_size: int, bandwidth_bps: float, extra_latency_s: float = 0.0) -> Network:
        return Network(
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
            "comm_rel_spread": self.comm_rel_spread,
            "calibrated_rates_bps": list(self.calibrated_rates_bps),
            "calibrated_unshaped": self.calibrated_unshaped,
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

    def function(self, world_size: int, extra_latency_s: float = 0.0) -> Network:
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
        comm_rel_spread(calibration),
        (calibrated_rate_bps(calibration),),
        calibration.rate_bps is None,
    )


def comm_rel_spread(c: Calibration) -> float:
    """The relative uncertainty of a calibration's collective times: the larger root-mean-square relative residual
    of its all-reduce and all-gather fits (how far its own samples lie from the line the model uses)."""
    return max(c.fitted.allreduce_fit.rel_rms, c.fitted.allgather_fit.rel_rms)


EXTRAPOLATION_TOLERANCE = 0.10


def is_extrapolated(rates_bps: Sequence[float], bandwidth_bps: float, *, open_above: bool = False) -> bool:
    """Whether `bandwidth_bps` lies outside [min, max] of the calibrated `rates_bps` by more than 10 %.
    `open_above`: one calibration was unshaped, so a rate above them all is the unshaped link it measured (an
    unshaped trial is predicted at its probe's goodput, beyond the all-reduce bandwidth that calibration reached)."""
    if not rates_bps:
        return False
    lo, hi = min(rates_bps), math.inf if open_above else max(rates_bps)
    return not (lo * (1 - EXTRAPOLATION_TOLERANCE) <= bandwidth_bps <= hi * (1 + EXTRAPOLATION_TOLERANCE))


# --------------------------------------------------------------------------------------------- several rates
def calibrated_rate_bps(c: Calibration) -> float:
    """Where a calibration sits on the rate axis: its shaped rate, or for one measured unshaped the all-reduce
    bandwidth it reached (what an unshaped link gives the collectives)."""
    return float(c.rate_bps) if c.rate_bps else float(c.fitted.bandwidth_bps)


def axis_rates_bps(calibrations: Sequence[Calibration]) -> list[float]:
    """Where each of a group's calibrations sits on the rate axis that `TermsByRate` interpolates along: a shaped one
    at its rate; an unshaped one above every shaped one, since it measured the link no shaping slows: at the
    all-reduce bandwidth it reached (`calibrated_rate_bps`) or, where a shaped rate lies within 10 % of that or above
    it, 10 % above the highest shaped rate. (Seed 8's configuration 4 reached 4.69 Gbit unshaped beside a 5 Gbit
    calibration: placed at 4.69 Gbit, every unshaped trial, predicted at its goodput, took the 5 Gbit calibration's
    host and contention terms instead of the unshaped one's.)"""
    top = max((float(c.rate_bps) for c in calibrations if c.rate_bps), default=0.0)
    return [calibrated_rate_bps(c) if c.rate_bps else max(calibrated_rate_bps(c), top * (1 + EXTRAPOLATION_TOLERANCE))
            for c in calibrations]


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
    from all of them (an unshaped one above the shaped ones: `axis_rates_bps`). Latency / efficiency given on the
    command line override every point."""

    calibrations: tuple[Calibration, ...]  # one per rate, ascending on the rate axis (axis_rates_bps): unshaped last
    latency_s: float | None = None
    efficiency: float | None = None

    def __post_init__(self) -> None:
        if len(self.calibrations) < 2:
            raise ValueError("TermsByRate needs calibrations at two or more rates")

    @cached_property
    def _points(self) -> tuple[list[float], list[dict[str, float]]]:
        """Each calibration's rate and terms, computed once (a curve or crossover asks at many bandwidths)."""
        return axis_rates_bps(self.calibrations), [c.model_terms() for c in self.calibrations]

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
            self.comm_rel_spread,
            tuple(rates),
            self.calibrated_unshaped,
        )

    @property
    def comm_rel_spread(self) -> float:
        return max(comm_rel_spread(c) for c in self.calibrations)

    @property
    def calibrated_rates_bps(self) -> tuple[float, ...]:
        return tuple(self._points[0])

    @property
    def calibrated_unshaped(self) -> bool:
        return any(c.rate_bps is None for c in self.calibrations)

    def extrapolated(self, bandwidth_bps: float) -> bool:
        """Whether `bandwidth_bps` lies outside the calibrated rates (by more than 10 %)."""
        return is_extrapolated(self.calibrated_rates_bps, bandwidth_bps, open_above=self.calibrated_unshaped)

    @property
    def unshaped_rate_bps(self) -> float | None:
        """The rate an unshaped link stands at: where the unshaped calibration sits on the rate axis
        (`axis_rates_bps`: the all-reduce bandwidth it reached, or above the highest shaped rate), so that a
        prediction there takes its terms."""
        return next((r for r, c in zip(self.calibrated_rates_bps, self.calibrations, strict=True) if c.rate_bps is None),
                    None)  # fmt: skip

    def network(self, world_size: int, bandwidth_bps: float, extra_latency_s: float = 0.0) -> Network:
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
            "comm_rel_spread": self.comm_rel_spread,
            "calibrated_rates_bps": list(self.calibrated_rates_bps),
            "calibrated_unshaped": self.calibrated_unshaped,
            "interpolated_by_rate": [
                {"rate_bps": r, **self.at(r).as_dict()} for r in self.calibrated_rates_bps
            ]
        }

    def describe(self) -> str:
        parts = [
            f"at {format_rate(int(r))}: {self.at(r).describe_terms()}" for r in self.calibrated_rates_bps
        ]
        return "; ".join(parts) + f"; {self.source}"


def pick_calibrations(
    calibrations: Iterable[Calibration], world_size: int, backend: str | None = None, cross_traffic: int = 0
) -> list[Calibration]:
    """The calibrations a prediction for `world_size` ranks interpolates between: beside `cross_traffic` flows, the
    same backend when given, the closest world size, the newest one at each rate; ascending on the rate axis (the
    shaped ones by rate, an unshaped one last: `axis_rates_bps`)."""
    calibrations = list(calibrations)
    first = pick_calibration(calibrations, world_size, backend, cross_traffic)
    if first is None:
        return []
    same = [c for c in calibrations if c.backend == first.backend and c.world_size == first.world_size
            and c.cross_traffic == cross_traffic]  # fmt: skip
    newest: dict[int | None, Calibration] = {}
    for c in sorted(same, key=lambda c: newest_first_key(c.created_at)):
        newest.setdefault(c.rate_bps, c)
    return sorted(newest.values(), key=lambda c: (c.rate_bps is None, calibrated_rate_bps(c)))


def terms_for(
    calibrations: Iterable[Calibration],
    world_size: int,
    *,
    backend: str | None = None,
    latency_s: float | None = None,
    efficiency: float | None = None,
    cross_traffic: int = 0,
) -> ModelTerms | TermsByRate:
    """The terms a prediction for `world_size` ranks uses: one calibration's (model_terms; the defaults without any),
    or, with calibrations at several rates, those interpolated by rate. `cross_traffic` N > 0: only calibrations
    measured beside N flows (`testbed calibrate --cross-traffic N`)."""
    picked = pick_calibrations(list(calibrations), world_size, backend, cross_traffic)
    if len(picked) < 2:
        return model_terms(picked[0] if picked else None, latency_s=latency_s, efficiency=efficiency)
    return TermsByRate(tuple(picked), latency_s, efficiency)
