"""The crossover: the bandwidth where a compressor's predicted iteration time equals a baseline's (`crossover`,
`find_crossover` on a log grid refined by bisection), the rule that picks one among several crossings
(`choose_crossing`, used for predicted and measured curves alike), the crossover of measured speedups
(`crossover_from_samples`) and the best speedup per compressor over a range (`summarize`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shaping.units import format_rate
from testbed.errors import InputError
from testbed.perfmodel.prediction import Terms, at, predict_curves, predict_iteration
from testbed.perfmodel.profiles import Profile


@dataclass(frozen=True)
class Crossover:
    """Where a compressor's predicted time equals the baseline's, within [low_bps, high_bps].

    kind: "crossover" (bandwidth_bps set), "always" (compressor faster across the range), "never" (never faster).
    wins_below: for a crossover, True when the compressor is faster below `bandwidth_bps` (the usual case).
    """

    compressor: str
    baseline: str
    kind: str
    bandwidth_bps: float | None
    low_bps: float
    high_bps: float
    wins_below: bool | None = None
    crossings_bps: tuple[float, ...] = ()

    def describe(self, fmt: Callable[[float], str] | None = None) -> str:
        fmt = fmt or rate_text
        if self.kind == "always":
            return f"always faster ({fmt(self.low_bps)}..{fmt(self.high_bps)})"
        if self.kind == "never":
            return f"never faster ({fmt(self.low_bps)}..{fmt(self.high_bps)})"
        side = "below" if self.wins_below else "above"
        return f"{fmt(self.bandwidth_bps)} (faster {side})"


def rate_text(bps: float) -> str:
    """A rate as the model prints it: shaping.units.format_rate with 3 significant digits (1.23gbit)."""
    return format_rate(bps, digits=3)



def log_grid(low_bps: float, high_bps: float, points: int) -> list[float]:
    """`points` bandwidths evenly spaced in log between low and high, both included."""
    if not (0 < low_bps <= high_bps):
        raise InputError(f"bandwidth range {low_bps!r}..{high_bps!r}: expected 0 < low <= high")
    if points < 1:
        raise InputError(f"points {points}: expected >= 1")
    if points == 1 or low_bps == high_bps:
        return [float(low_bps)]
    step = math.log(high_bps / low_bps) / (points - 1)
    grid = [low_bps * math.exp(i * step) for i in range(points)]
    grid[-1] = float(high_bps)
    return grid


def find_crossover(
    diff: Callable[[float], float], low_bps: float, high_bps: float, *, points: int = 64, rel_tol: float = 1e-6
) -> tuple[str, float | None, bool | None, tuple[float, ...]]:
    """Roots of `diff(B) = t_compressor(B) - t_baseline(B)` on a log grid, refined by bisection in log(B).

    Returns (kind, bandwidth_bps, wins_below, all crossings). Compressor "wins" where diff < 0.
    With several crossings, the reported one is the highest win->lose crossing (the bandwidth above which the
    compressor stops paying), or else the lowest lose->win crossing.
    """
    grid = log_grid(low_bps, high_bps, max(points, 2))
    vals = [diff(b) for b in grid]
    wins = [v < 0 for v in vals]
    if all(wins):
        return "always", None, None, ()
    if not any(wins):
        return "never", None, None, ()
    crossings: list[tuple[float, bool]] = []
    for i in range(len(grid) - 1):
        if wins[i] == wins[i + 1]:
            continue
        lo, hi = grid[i], grid[i + 1]
        lo_wins = wins[i]
        while hi / lo > 1 + rel_tol:
            mid = math.sqrt(lo * hi)
            if (diff(mid) < 0) == lo_wins:
                lo = mid
            else:
                hi = mid
        crossings.append((math.sqrt(lo * hi), lo_wins))
    b_star, wins_below = choose_crossing(crossings)
    return "crossover", b_star, wins_below, tuple(b for b, _ in crossings)


def choose_crossing(crossings: Sequence[tuple[float, bool]]) -> tuple[float, bool]:
    """The crossover rule, for predicted and measured curves alike. `crossings` are (bandwidth, wins_below) in rising
    bandwidth. The reported one is the highest win->lose crossing (the bandwidth above which the compressor stops
    paying), or else the lowest lose->win crossing. Returns (bandwidth_bps, wins_below)."""
    win_to_lose = [b for b, wins_below in crossings if wins_below]
    if win_to_lose:
        return win_to_lose[-1], True
    return crossings[0][0], False


def crossover_from_samples(
    rates_bps: Sequence[float], speedups: Sequence[float]
) -> tuple[str, float | None, bool | None]:
    """Crossover of sampled speedups (compressor over baseline, > 1 wins) through 1.0, interpolated in log-log
    between neighbouring rates; the same rule as `find_crossover` picks among several crossings.

    Returns (kind, bandwidth_bps, wins_below): ("crossover", B, ...), ("always"/"never", None, None), or
    ("n/a", None, None) when fewer than two rates have a positive speedup.
    """
    pts = sorted(
        (r, s) for r, s in zip(rates_bps, speedups, strict=True) if r and r > 0 and s and s > 0 and not math.isnan(s)
    )
    if len(pts) < 2:
        return "n/a", None, None
    wins = [s > 1.0 for _, s in pts]
    if all(wins):
        return "always", None, None
    if not any(wins):
        return "never", None, None
    crossings = []
    for (r0, s0), (r1, s1), w0, w1 in zip(pts, pts[1:], wins, wins[1:], strict=False):
        if w0 == w1:
            continue
        d0, d1 = math.log(s0), math.log(s1)
        frac = d0 / (d0 - d1) if d0 != d1 else 0.5
        crossings.append((math.exp(math.log(r0) + frac * (math.log(r1) - math.log(r0))), w0))
    b_star, wins_below = choose_crossing(crossings)
    return "crossover", b_star, wins_below


def crossover(
    profile: Profile,
    compressor: str,
    world_size: int,
    low_bps: float,
    high_bps: float,
    *,
    baseline: str = "syncsgd",
    terms: Terms = None,
    hook_blocks_backward: bool = False,
    points: int = 64,
) -> Crossover:
    """Bandwidth B* in [low, high] where `compressor`'s predicted iteration time equals `baseline`'s (`terms` as in
    predict_curves)."""

    def t(name: str, b: float) -> float:
        return predict_iteration(
            profile, name, at(terms, world_size, b), hook_blocks_backward=hook_blocks_backward
        ).iter_time_s

    kind, b_star, wins_below, crossings = find_crossover(
        lambda b: t(compressor, b) - t(baseline, b), low_bps, high_bps, points=points
    )
    return Crossover(compressor, baseline, kind, b_star, float(low_bps), float(high_bps), wins_below, crossings)


def crossover_interval(
    profile: Profile,
    compressor: str,
    world_size: int,
    low_bps: float,
    high_bps: float,
    *,
    baseline: str = "syncsgd",
    terms: Terms = None,
    hook_blocks_backward: bool = False,
    comm_rel_spread: float = 0.0,
    points: int = 32,
) -> tuple[float, float] | None:
    """The rates around the predicted crossover where the two predictions' intervals overlap (`Prediction.low_s`,
    `high_s`: the profile's and the calibration's spread): from the crossing of the compressor's upper bound with the
    baseline's lower one to the crossing of its lower bound with the baseline's upper one, the range's ends where
    one of them does not cross (the whole range). None when neither crosses."""

    def pred(name: str, b: float):
        return predict_iteration(profile, name, at(terms, world_size, b), hook_blocks_backward=hook_blocks_backward,
                                 comm_rel_spread=comm_rel_spread)  # fmt: skip

    ends = []
    for mine, theirs in (("high_s", "low_s"), ("low_s", "high_s")):
        kind, b, _, _ = find_crossover(
            lambda b, mine=mine, theirs=theirs: getattr(pred(compressor, b), mine) - getattr(pred(baseline, b), theirs),
            low_bps, high_bps, points=points)  # fmt: skip
        ends.append(b if kind == "crossover" else None)
    found = [b for b in ends if b is not None]
    if not found:
        return None
    if len(found) < 2:  # one bound never crosses inside the range: the crossover may lie anywhere in it
        return float(low_bps), float(high_bps)
    return float(min(found)), float(max(found))


@dataclass(frozen=True)
class SpeedupSummary:
    compressor: str
    baseline: str
    max_speedup: float
    at_bps: float
    crossover: Crossover


def summarize(
    profile: Profile,
    world_size: int,
    bandwidths_bps: Sequence[float],
    *,
    baseline: str = "syncsgd",
    compressors: Sequence[str] | None = None,
    terms: Terms = None,
    hook_blocks_backward: bool = False,
) -> dict[str, SpeedupSummary]:
    """Best speedup over `baseline` in the range, and the crossover, per compressor (`terms` as in predict_curves)."""
    names = list(compressors) if compressors else profile.compressor_names()
    curves = predict_curves(profile, world_size, bandwidths_bps, compressors=sorted(set(names) | {baseline}),
                            terms=terms, hook_blocks_backward=hook_blocks_backward)  # fmt: skip
    base = curves[baseline]
    lo, hi = min(bandwidths_bps), max(bandwidths_bps)
    out = {}
    for name in names:
        speedups = [b.iter_time_s / c.iter_time_s for b, c in zip(base, curves[name], strict=True)]
        i = max(range(len(speedups)), key=speedups.__getitem__)
        cx = (
            crossover(profile, name, world_size, lo, hi, baseline=baseline, terms=terms,
                      hook_blocks_backward=hook_blocks_backward)  # fmt: skip
            if lo < hi
            else Crossover(name, baseline, "always" if speedups[0] > 1 else "never", None, lo, hi)
        )
        out[name] = SpeedupSummary(name, baseline, speedups[i], float(bandwidths_bps[i]), cx)
    return out
