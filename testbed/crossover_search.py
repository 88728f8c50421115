"""Find, by measurement, the link rate where a compressor's iteration time equals the baseline's (`testbed crossover`).

Pure: no cluster, no store. `next_step(settings, measured)` replays the search over what is measured so far and says
either which rate to measure next (and how many runs of each side it needs there) or what the answer is. The same
measurements always give the same next step, so a search stopped anywhere resumes where it stopped: the driver
(testbed/crossover_run.py) only looks the runs up in the results store and runs the missing ones.

The search, for a compressor C against a baseline S over the rates [low, high] (d(B) = t_C(B) - t_S(B), about
linear in 1/B where both are compute + bytes / B; C "wins" at B where it is decidedly faster, see `judge`: one
run each decides where their medians are more than `one_run_gap` apart and one median lies beyond the other run's
p5..p95, else `repeats` runs each and Welch's test):
  1. Start at the model's predicted crossover (clamped to the range; the range's log-midpoint without one).
  2. Bracket: while every measured rate is on one side, step out towards the side where the crossing must be: first
     just past the precision ((1 + precision)^0.95: when the model aimed right, two rates bracket the crossing to the
     precision at once), then 1.25x beyond where the line through the last two rates' d crosses 0 (a step of 2 to
     16; x `step` without a prediction, or when the first guess missed by more than the precision). No step is
     shorter than 1.25 e^|f| of the last rate's log-ratio f = ln(t_C / t_S): with t = compute + bytes / B, moving
     the rate by k changes f by at most ln k, so the crossing lies at least e^|f| away (measured 2026-12-04: PowerSGD
     won by f = -0.20 at the model's guess, and the step just past the precision spent 6 trials to find it again).
     C wins at the top of the range: "always" (it pays at every rate up to `high`); C loses at the bottom:
     "never". (The usual shape, C faster below the crossover, is assumed only to choose the direction of the
     step-out; a bracket found either way round is refined the same way.)
  3. Refine the bracket (a, b) (decided rates on opposite sides) until b / a <= 1 + precision: aim at the crossing
     the line through (1/a, d(a)), (1/b, d(b)) predicts, offset by 0.45 ln(1 + precision) towards the larger part
     of the bracket, so that the next rate and the one after it straddle the crossing within the precision when the
     line is right; when the last two rates replaced the same end of the bracket, bisect in log-rate instead.
  4. A rate where C and S tie (Welch's test on `repeats` runs of each, `report.analysis.tie_flags`) ends the search:
     "equal within noise" at that rate, between the nearest decided rates around it. A tie before any bracket
     (the model aimed at a rate where the two are close) first steps out on each side, by `step` and then by
     `step`^2 from a side's last tie, until a decided rate (or the range's end) bounds the tied ones.
Every measured rate is rounded to 3 significant digits and snapped to an already-stored rate within (1 + precision)
^ 1/4 (strictly inside the bracket), so a grid's trials are reused and a resumed search asks for the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shaping.units import format_rate
from testbed.errors import InputError

WIN, LOSE, TIE = "win", "lose", "tie"
KINDS = ("crossover", "tie", "always", "never")  # always: C wins at the top of the range; never: loses at the bottom
MAX_POINTS = 40  # a guard: every step narrows the bracket or moves towards an end of the range
# One run of each side decides a rate only where their medians are more than this apart. A trial's median moves
# between launches: measured 2026-12-04 on the 2-core machine (2 hosts, resnet18, 3 launches each at 2.48 and
# 5 Gbit/s), sync SGD by up to 8 %, PowerSGD by up to 11 %; signSGD at 1.5 Gbit/s by 42 %. Closer than this, the
# order of one run each is the launches' noise: `repeats` runs each and Welch's test decide.
ONE_RUN_GAP = 0.10


@dataclass(frozen=True)
class Run:
    """One stored trial's iteration times (seconds): its median and its 5th/95th percentiles."""

    p50_s: float
    p5_s: float
    p95_s: float


@dataclass(frozen=True)
class Point:
    """The runs of both sides at one rate (repeats: the same trial with seeds seed, seed+1, ...)."""

    rate_bps: int
    compressor: tuple[Run, ...] = ()
    baseline: tuple[Run, ...] = ()


@dataclass(frozen=True)
class Settings:
    low_bps: int
    high_bps: int
    precision: float = 0.10  # the bracket's width as a fraction of its rate: stop when high / low <= 1 + precision
    repeats: int = 3  # runs of each side at a rate where one run each does not decide (the tie test's sample)
    start_bps: float | None = None  # the model's predicted crossover (None: no prediction in the range)
    step: float = 4.0  # the first step out of a wrong first guess
    alpha: float = 0.05  # the tie test's level (report.analysis.TIE_ALPHA)
    one_run_gap: float = ONE_RUN_GAP  # one run each decides only where their medians are further apart than this
    known_bps: tuple[int, ...] = ()  # rates with stored runs: a proposal close to one measures there instead

    def __post_init__(self) -> None:
        check_range(self.low_bps, self.high_bps)
        check_fraction(self.precision, "--precision")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or not 1 <= self.repeats <= 20:
            raise InputError(
                f"--repeats {self.repeats!r}: expected an integer from 1 to 20 (runs per side at a close rate)"
            )
        if not (math.isfinite(self.step) and self.step > 1):
            raise InputError(f"step {self.step!r}: expected a factor > 1")
        check_fraction(self.one_run_gap, "--one-run-gap", lowest=0.0)


def check_range(low_bps: float, high_bps: float) -> None:
    if not (0 < low_bps < high_bps):
        raise InputError(
            f"--bw-range {format_rate(low_bps)}..{format_rate(high_bps)}: an empty or inverted range; expected "
            "LOW..HIGH with 0 < LOW < HIGH, e.g. 50mbit..25gbit"
        )


def check_fraction(value: float, flag: str, lowest: float | None = None, shown: str | None = None) -> None:
    """A fraction in (0, 10] (from `lowest` inclusive when given), else InputError naming `flag` and the value as
    given (`shown`)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value <= 10
    ok = ok and (value >= lowest if lowest is not None else value > 0)
    if not ok:
        span = f"[{lowest:g}, 10]" if lowest is not None else "(0, 10]"
        raise InputError(f"{flag} {shown or repr(value)}: expected a fraction in {span}, e.g. 10% or 0.1")


def parse_fraction(text: str, flag: str = "--precision", lowest: float | None = None) -> float:
    """`10%` or `0.1` -> 0.1, for --precision and --one-run-gap (InputError naming `flag` and what is accepted)."""
    t = str(text).strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected a percentage like 10% or a fraction like 0.1") from None
    check_fraction(value, flag, lowest, shown=t)
    return value


# ---------------------------------------------------------------------------------------------- one rate
@dataclass(frozen=True)
class Verdict:
    """What the runs at one rate say: WIN / LOSE / TIE, or None with the runs each side still needs."""

    outcome: str | None
    need_compressor: int = 0
    need_baseline: int = 0
    f: float | None = None  # ln(mean t_C / mean t_S) of the runs' medians
    d: float | None = None  # mean t_C - mean t_S (seconds): about linear in 1/B where both are compute + bytes / B


def judge(point: Point, repeats: int, alpha: float = 0.05, one_run_gap: float = ONE_RUN_GAP) -> Verdict:
    """The runs so far decide when their medians are more than `one_run_gap` apart and one side's median lies
    beyond the other's iterations: the slower's median above the faster's p95, or the faster's median below the
    slower's p5 (so a few stalled iterations in one run, which move its p95 and not its median, do not call for
    repeats). Otherwise `repeats` runs each and Welch's test (report.analysis.tie_flags) decide: a tie when it cannot
    tell the two apart at level `alpha`."""
    c, s = point.compressor, point.baseline
    if not c or not s:
        return Verdict(None, max(0, 1 - len(c)), max(0, 1 - len(s)))
    tc, ts = _mean(r.p50_s for r in c), _mean(r.p50_s for r in s)
    f, d = math.log(tc / ts), tc - ts
    if abs(f) > math.log1p(one_run_gap):
        fast, slow = (c, s) if f < 0 else (s, c)
        if (max(r.p50_s for r in fast) < min(r.p5_s for r in slow)
                or max(r.p95_s for r in fast) < min(r.p50_s for r in slow)):  # fmt: skip
            return Verdict(WIN if f < 0 else LOSE, f=f, d=d)
    if repeats < 2:  # no repeats asked for: the medians decide
        return Verdict(WIN if f < 0 else LOSE, f=f, d=d)
    if len(c) < repeats or len(s) < repeats:
        return Verdict(None, max(0, repeats - len(c)), max(0, repeats - len(s)), f, d)
    from testbed.report.analysis import tie_flags

    tie = tie_flags([([r.p50_s for r in c], [r.p50_s for r in s])], alpha=alpha)[0]
    return Verdict(TIE if tie else (WIN if f < 0 else LOSE), f=f, d=d)


def _mean(values: Iterable[float]) -> float:
    v = list(values)
    return sum(v) / len(v)


# ---------------------------------------------------------------------------------------------- the search
@dataclass(frozen=True)
class Visit:
    rate_bps: int
    outcome: str
    f: float | None
    runs: int  # trials (both sides) used at this rate


@dataclass(frozen=True)
class Measure:
    """Measure here next: `compressor_runs` and `baseline_runs` runs in all (repeats included) at `rate_bps`."""

    rate_bps: int
    compressor_runs: int
    baseline_runs: int
    visits: tuple[Visit, ...] = ()
    bracket: tuple[int, int] | None = None
    points_left: int = 1  # the estimate of rates still to measure, this one included

    @property
    def trials_left(self) -> int:
        return 2 * self.points_left


@dataclass(frozen=True)
class Answer:
    kind: str  # crossover | tie | always | never
    low_bps: int  # crossover: the bracket; tie: the nearest decided rates around the tie; always/never: the range
    high_bps: int
    estimate_bps: float | None = None  # crossover: where the line through the bracket's ends crosses; tie: its rate
    wins_below: bool | None = None  # crossover: C is faster below it (the usual case)
    visits: tuple[Visit, ...] = field(default=())

    @property
    def trials(self) -> int:
        return sum(v.runs for v in self.visits)

    def describe(self, label: str) -> str:
        n = f"{self.trials} trial{'s' if self.trials != 1 else ''}"
        lo, hi = format_rate(self.low_bps, 3), format_rate(self.high_bps, 3)
        if self.kind == "crossover":
            return f"{label} pays {'below' if self.wins_below else 'above'} {lo}-{hi}, {n}"
        if self.kind == "tie":
            at = format_rate(self.estimate_bps, 3)
            between = f" (between {lo} and {hi})" if self.low_bps < self.high_bps else ""
            return f"{label} and the baseline are equal within noise at {at}{between}, {n}"
        if self.kind == "always":
            return f"{label} pays at every rate in {lo}..{hi} (faster at the top), {n}"
        return f"{label} never pays in {lo}..{hi} (slower at the bottom), {n}"


def next_step(s: Settings, measured: Mapping[int, Point]) -> Measure | Answer:
    """Replay the search over `measured` (rate -> its runs) and return the next rate to measure or the answer."""
    visits: list[Visit] = []
    verdicts: dict[int, Verdict] = {}

    def visit(rate: int) -> Verdict:
        v = judge(measured.get(rate, Point(rate)), s.repeats, s.alpha, s.one_run_gap)
        verdicts[rate] = v
        if v.outcome is not None:
            p = measured[rate]
            visits.append(Visit(rate, v.outcome, v.f, len(p.compressor) + len(p.baseline)))
        return v

    def ask(rate: int, v: Verdict, bracket, points_left: int) -> Measure:
        point = measured.get(rate, Point(rate))
        return Measure(rate, len(point.compressor) + v.need_compressor, len(point.baseline) + v.need_baseline,
                       tuple(visits), bracket, points_left)  # fmt: skip

    lo_b, hi_b = s.low_bps, s.high_bps
    w = math.log1p(s.precision)
    start = s.start_bps if s.start_bps and s.start_bps > 0 else math.sqrt(lo_b * hi_b)
    rate = _snap(min(max(start, lo_b), hi_b), None, s)
    side: list[tuple[int, Verdict]] = []  # the rates measured before a bracket, all on one side
    ties: list[int] = []  # rates tied before a bracket: the answer is a tie, once decided rates bound it
    for _ in range(MAX_POINTS):  # 1-2: the first guess, then step out until the outcome flips
        v = visit(rate)
        if v.outcome is None:
            return ask(rate, v, None, 3)
        if v.outcome == TIE:
            ties.append(rate)
        else:
            side.append((rate, v))
        if ties:  # find the decided rates around the tied ones (or the range's ends): x step, then x step^2
            below = [r for r, _ in side if r < min(ties)]
            above = [r for r, _ in side if r > max(ties)]
            # the first step out of a side by `step` keeps the band that bounds the tie narrow (x step^2 left
            # signSGD's tie at 1.64 Gbit/s between 102 Mbit/s and 5 Gbit/s, 49x); a side tied again widens it
            down = s.step ** (2 if min(ties) < ties[0] else 1)
            up = s.step ** (2 if max(ties) > ties[0] else 1)
            out: list[int] = []  # the unexplored sides (snapping may land on a rate already tied)
            if not below and min(ties) > lo_b:
                out.append(_snap(max(min(ties) / down, lo_b), None, s))
            if not above and max(ties) < hi_b:
                out.append(_snap(min(max(ties) * up, hi_b), None, s))
            fresh = [r for r in out if r not in verdicts]
            if fresh:
                rate = fresh[0]
                continue
            return _tie(ties[0], visits, verdicts, max(below, default=min(ties)), min(above, default=max(ties)))
        if side[0][1].outcome != v.outcome:
            break
        up = v.outcome == WIN  # C wins here: the crossing (C faster below it) lies above
        end = hi_b if up else lo_b
        if rate == end:
            return Answer("always" if up else "never", lo_b, hi_b, visits=tuple(visits))
        nxt = _snap(_step_out(side, up, s), None, s)
        rate = nxt if nxt not in verdicts else end  # a stored rate snapped back onto one visited: go to the end
    else:
        raise AssertionError("crossover search: no bracket after MAX_POINTS rates")  # pragma: no cover
    prev = side[-2][0]
    a, b = min(prev, rate), max(prev, rate)
    moved: list[str] = []  # the outcome of each refinement: which end of the bracket it replaced
    for _ in range(MAX_POINTS):  # 3: refine the bracket
        if b <= a * (1 + s.precision) * (1 + 1e-9):
            return _crossover(a, b, verdicts, visits)
        rate = _refine(a, b, verdicts, len(moved) >= 2 and moved[-1] == moved[-2], w, s)
        v = visit(rate)
        if v.outcome is None:
            return ask(rate, v, (a, b), 1 + _refine_left((a, b), w))
        if v.outcome == TIE:
            return _tie(rate, visits, verdicts)
        moved.append(v.outcome)
        a, b = (rate, b) if v.outcome == verdicts[a].outcome else (a, rate)
    raise AssertionError("crossover search: no answer after MAX_POINTS rates")  # pragma: no cover


def _step_out(side: Sequence[tuple[int, Verdict]], up: bool, s: Settings) -> float:
    """The next rate when every rate so far is on one side: x `step` the first time, then 1.25x beyond where the
    line through the last two rates' d (linear in 1/B) crosses 0, the step kept within 2 to 16; within the range."""
    rate, last = side[-1]
    # The crossing lies at least a factor e^|f| away: t = compute + bytes / B, so moving the rate by k changes each
    # side's log-time by at most ln k and their log-ratio f by at most ln k. A step shorter than that cannot reach it.
    least = math.exp(abs(last.f)) if last.f is not None else 1.0
    near = (1 + s.precision) ** 0.95
    # the first step: just past the precision when the model may have aimed right (two rates then bracket the
    # crossing), `step` when the first guess missed by more than that, or there was none
    factor = near if len(side) == 1 and s.start_bps and least <= near else s.step
    if len(side) >= 2:
        root = _root(side[-2][0], side[-2][1].d, rate, side[-1][1].d)
        if root is not None and (root > rate) == up:
            factor = min(max(math.exp(abs(math.log(root / rate))) * 1.25, 2.0), 16.0)
        elif root is not None or side[-2][1].d == side[-1][1].d:
            factor = 16.0  # the line points the wrong way or is flat (noise): keep stepping, faster
    if least > near:  # past the bound, with room: a step to exactly e^|f| finds a tie at best
        factor = max(factor, least * 1.25)
    x = rate * factor if up else rate / factor
    return min(max(x, s.low_bps), s.high_bps)


def _root(a: float, da: float | None, b: float, db: float | None) -> float | None:
    """Where d = alpha + beta / B through (a, da), (b, db) is 0 (None: no such positive rate)."""
    if da is None or db is None or da == db or a == b:
        return None
    xa, xb = 1 / a, 1 / b
    x0 = xa - da * (xb - xa) / (db - da)
    return 1 / x0 if x0 > 0 else None


def _refine(a: int, b: int, verdicts: Mapping[int, Verdict], stalled: bool, w: float, s: Settings) -> int:
    """The next rate inside the bracket (a, b): aimed beside the interpolated crossing, or the log-midpoint when
    one end stayed put for the last two refinements (the line keeps missing on one side)."""
    la, lb = math.log(a), math.log(b)
    x = (la + lb) / 2
    root = _root(a, verdicts[a].d, b, verdicts[b].d)
    if not stalled and root is not None and a < root < b:
        u = math.log(root)
        x = u - 0.45 * w if (u - la) > (lb - u) else u + 0.45 * w
        edge = 0.05 * (lb - la)
        x = min(max(x, la + edge), lb - edge)
    return _snap(math.exp(x), (a, b), s)


def _refine_left(bracket: tuple[int, int], w: float) -> int:
    """Rates still to measure once the bracket is (a, b): about two when the line through its ends is right, at most
    what bisection needs."""
    a, b = bracket
    width = math.log(b / a)
    if width <= w:
        return 0
    return min(2, math.ceil(math.log2(width / w)))


def _snap(x: float, bracket: tuple[int, int] | None, s: Settings) -> int:
    """`x` rounded to 3 significant digits, or a stored rate within (1 + precision)^(1/4) of it; strictly inside
    `bracket` when one is given (more digits when 3 would land on an end), else within the range."""
    lo, hi = (bracket[0], bracket[1]) if bracket else (s.low_bps, s.high_bps)
    near = math.log1p(s.precision) / 4
    inside = [k for k in s.known_bps if (lo < k < hi if bracket else lo <= k <= hi)
              and abs(math.log(k / x)) <= near]  # fmt: skip
    if inside:
        return min(inside, key=lambda k: abs(math.log(k / x)))
    for digits in range(3, 12):
        r = int(float(f"{x:.{digits}g}"))
        if (lo < r < hi) if bracket else (lo <= r <= hi):
            return r
    return int(min(max(round(x), lo), hi))


def _crossover(a: int, b: int, verdicts: Mapping[int, Verdict], visits: Sequence[Visit]) -> Answer:
    root = _root(a, verdicts[a].d, b, verdicts[b].d)
    est = min(max(root, a), b) if root is not None else math.sqrt(a * b)
    return Answer("crossover", a, b, est, verdicts[a].outcome == WIN, tuple(visits))


def _tie(rate: int, visits: Sequence[Visit], verdicts: Mapping[int, Verdict], below=None, above=None) -> Answer:
    """A tie at `rate`, between the nearest decided rates around it (given, or found among the verdicts)."""
    decided = [r for r, v in verdicts.items() if v.outcome in (WIN, LOSE)]
    below = below if below is not None else max((r for r in decided if r < rate), default=rate)
    above = above if above is not None else min((r for r in decided if r > rate), default=rate)
    return Answer("tie", below, above, float(rate), None, tuple(visits))


def prediction_ratio(predicted_bps: float | None, answer: Answer) -> float | None:
    """The model's predicted crossover over the measured one (its estimate inside the bracket, or the tie's rate)."""
    if not predicted_bps or answer.estimate_bps is None or answer.kind not in ("crossover", "tie"):
        return None
    return predicted_bps / answer.estimate_bps
