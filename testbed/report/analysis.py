"""Report analysis: input checks on the results frame, pooling of repeated trials, speedups over a baseline, the
headline, measured crossovers (perfmodel's rule) and the verdicts on predicted ones (the predictions: predicted.py). Pure pandas: no plotting, no
output files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from shaping.units import rate_or_unshaped
from testbed import caveats
from testbed import perfmodel as pm
from testbed.errors import InputError

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)  # 2-6 only added columns (2: placement, overlap, peer skew, GPU versions; 3: learning); 6 also changed the default bucket (burst_bytes says which a row had)
REQUIRED_COLUMNS = (
    "schema_version",
    "trial_id",
    "status",
    "rate_bps",
    "world_size",
    "model",
    "batch_size",
    "compressor",
    "iter_time_s_p50",
)
PHASE_COLUMNS = ("forward_s", "backward_s", "optimizer_s", "encode_s", "comm_s", "decode_s")
# the overlap split (issue 35): work that took no iteration time; null in rows before it and for built-in syncsgd
HIDDEN_COLUMNS = ("comm_hidden_s", "codec_hidden_s")
DENSE_BASELINES = pm.BASELINES  # the catalogue's (runners/catalog.py DENSE_BASELINES)
GROUP_KEYS = ["model", "batch_size", "world_size"]


def baseline_description(baseline: str) -> str:
    if baseline == "syncsgd":
        return "fp32 sync SGD (syncsgd)"
    if baseline in ("fp16", "bf16"):
        return f"the 16-bit all-reduce baseline ({baseline})"
    raise InputError(f"--baseline {baseline}: expected one of {', '.join(DENSE_BASELINES)}")


def fmt_rate(bps: float) -> str:
    """shaping.units.rate_or_unshaped, a missing rate (NaN in a data frame) unshaped too."""
    return rate_or_unshaped(None if isinstance(bps, float) and math.isnan(bps) else bps)


def _variant(compressor: str, options) -> str:
    """Compressor label: the name, plus its options when any (powersgd[rank=4])."""
    if options is None or (isinstance(options, float) and math.isnan(options)):
        return compressor
    if isinstance(options, str):
        try:
            options = json.loads(options) if options.strip() else {}
        except json.JSONDecodeError:
            return f"{compressor}[{options}]"
    if not options:
        return compressor
    return f"{compressor}[{','.join(f'{k}={v}' for k, v in sorted(options.items()))}]"


def base_compressor(variant: str) -> str:
    """Compressor name of a variant label ('powersgd[rank=4] serial' -> 'powersgd')."""
    return variant.split("[")[0].split(" ")[0]


def is_serial(variant: str) -> bool:
    return variant.endswith(" serial")


def variant_profile(prof: pm.Profile, variant: str) -> pm.Profile:
    """The profile to predict a variant with: serial trials reduce the buckets only after backward."""
    return pm.serialized(prof) if is_serial(variant) else prof


def variant_order(v: str) -> tuple:
    base = base_compressor(v)
    return (pm.COMPRESSORS.index(base) if base in pm.COMPRESSORS else len(pm.COMPRESSORS), v)


def launch_spread_pct(times_s: Iterable[float]) -> float:
    """How far apart launches of one configuration ran: the slowest time over the fastest, minus 1, in percent (0 for
    one launch). On shared cores one launch's compute speed holds for its whole length and differs from the next's."""
    times = [float(t) for t in times_s]
    return (max(times) / min(times) - 1) * 100


def group_label(model: str, batch_size: int, world_size: int | None = None) -> str:
    s = f"{model} bs{int(batch_size)}"
    return s if world_size is None else f"{s}, {int(world_size)} workers"


# --------------------------------------------------------------------------------------------- input checks
def check_results(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], dict[str, int]]:
    """Validate a results frame. Returns (ok rows with derived columns, notes, status counts)."""
    if df is None or len(df) == 0:
        raise InputError("results: no trials found; run `testbed run` or `testbed sweep` first")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"results: missing column(s) {', '.join(missing)}; expected results schema {SCHEMA_VERSION}")
    notes: list[str] = []
    versions = sorted({int(v) for v in df["schema_version"].dropna().unique()})
    readable = ", ".join(map(str, READABLE_VERSIONS))
    if not set(versions) & set(READABLE_VERSIONS):
        raise InputError(
            f"results: schema_version {', '.join(map(str, versions)) or 'missing'} is not supported; "
            f"this report reads versions {readable}"
        )
    other = ~df["schema_version"].isin(READABLE_VERSIONS)
    if other.any():
        notes.append(
            f"{int(other.sum())} trial(s) with schema_version "
            f"{', '.join(str(v) for v in versions if v not in READABLE_VERSIONS)} skipped "
            f"(this report reads versions {readable})"
        )
        df = df[~other]
    counts = {str(k): int(v) for k, v in df["status"].value_counts().items()}
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise InputError(
            f"results: no trial with status ok ({', '.join(f'{v} {k}' for k, v in counts.items())}); nothing to plot"
        )
    for c in (
        "iter_time_s_p5",
        "iter_time_s_p95",
        "iter_time_s_mean",
        "samples_per_s",
        "delay_s",
        "measured_goodput_bps",
        "compressor_options",
        *PHASE_COLUMNS,
        *HIDDEN_COLUMNS,
    ):
        if c not in ok.columns:
            ok[c] = np.nan
    ok["t_s"] = ok["iter_time_s_p50"].fillna(ok["iter_time_s_mean"])
    ok["lo_s"] = ok["iter_time_s_p5"].fillna(ok["t_s"])
    ok["hi_s"] = ok["iter_time_s_p95"].fillna(ok["t_s"])
    bad = ok["t_s"].isna() | (ok["t_s"] <= 0)
    if bad.any():
        notes.append(f"{int(bad.sum())} ok trial(s) without an iteration time skipped")
        ok = ok[~bad]
    if warned := caveats.report_note(ok.to_dict("records")):
        notes.append(warned)
    ok["rate_bps"] = ok["rate_bps"].fillna(0).astype("int64")
    serial = ok["serial"].fillna(False).astype(bool) if "serial" in ok.columns else [False] * len(ok)
    ok["variant"] = [
        _variant(c, o) + (" serial" if sr else "")
        for c, o, sr in zip(ok["compressor"], ok["compressor_options"], serial, strict=True)
    ]
    return ok, notes, counts


def aggregate(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, batch, world, variant, rate): pooled repeats."""
    keys = [*GROUP_KEYS, "variant", "compressor", "rate_bps"]
    agg = (
        ok.groupby(keys, dropna=False)
        .agg(
            t_s=("t_s", "median"),
            rep_s=("t_s", tuple),  # every repeat's p50: the ties' test (`tie_flags`)
            lo_s=("lo_s", "min"),
            hi_s=("hi_s", "max"),
            trials=("trial_id", "count"),
            trial_id=("trial_id", "first"),
            samples_per_s=("samples_per_s", "median"),
            delay_s=("delay_s", "median"),
            goodput_bps=("measured_goodput_bps", "median"),
            **{c: (c, "mean") for c in PHASE_COLUMNS + HIDDEN_COLUMNS},
        )
        .reset_index()
    )
    return agg


# --------------------------------------------------------------------------------------------- speedups
def speedup_table(agg: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list[str]]:
    """Adds `speedup` (baseline time / time at the same group and rate) and `tie` (see `tie_flags`: per
    compressor curve, the rates where it cannot be told from the baseline); notes groups without a baseline."""
    notes = []
    base = agg[agg["variant"] == baseline][[*GROUP_KEYS, "rate_bps", "t_s", "rep_s", "trials"]].rename(
        columns={"t_s": "base_t_s", "rep_s": "base_rep_s", "trials": "base_trials"}
    )
    out = agg.merge(base, on=[*GROUP_KEYS, "rate_bps"], how="left")
    out["speedup"] = out["base_t_s"] / out["t_s"]
    out["tie"] = False
    for _, g in out.groupby([*GROUP_KEYS, "variant"]):
        pairs = [(r.rep_s, r.base_rep_s if isinstance(r.base_rep_s, tuple) else ()) for r in g.itertuples()]
        out.loc[g.index, "tie"] = tie_flags(pairs)
    out["tie"] = out["tie"].astype(bool)
    for key, g in out.groupby(GROUP_KEYS):
        if g["base_t_s"].isna().all():
            notes.append(f"{group_label(*key)}: no ok {baseline} trials; reported without speedups")
        elif g["base_t_s"].isna().any():
            rates = sorted({fmt_rate(r) for r in g.loc[g["base_t_s"].isna(), "rate_bps"]})
            notes.append(f"{group_label(*key)}: no ok {baseline} trials at {', '.join(rates)}; no speedups there")
    return out, notes


TIE_ALPHA = 0.05  # family-wise, over the rates of one compressor's curve


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of Welch's t-test that the repeats `a` and `b` (each trial's p50) share a mean; NaN when
    either has fewer than two. Both without spread: 0 when they differ, 1 when equal."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    if np.var(a) == 0 and np.var(b) == 0:
        return 1.0 if np.mean(a) == np.mean(b) else 0.0
    from scipy import stats  # here: a report without repeats (the GPU check's) also runs where scipy is missing

    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def tie_flags(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], alpha: float = TIE_ALPHA) -> list[bool]:
    """Per rate of one compressor's curve (its repeats, the baseline's repeats): whether the two are a tie there,
    i.e. the repeats do not show which is faster. Welch's t-test per rate, Holm-Bonferroni over the curve's rates so
    that the chance of calling any rate of a curve decided when the two are in truth the same is at most `alpha`
    (with a test per rate alone, a curve of 6 rates where nothing differs has one "decided" rate in about a quarter
    of sweeps; with 3 repeats each the old rule, ranges not overlapping, in about half). A rate where either side
    ran once is not a tie (its spread is unknown) and not part of the family."""
    ps = [welch_p(a, b) for a, b in pairs]
    family = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    ties = [not math.isnan(p) for p in ps]
    for j, (p, i) in enumerate(family):  # Holm: step down while the j-th smallest p beats alpha / (m - j)
        if p >= alpha / (len(family) - j):
            break
        ties[i] = False
    return ties


def counted_variants(variants: Iterable[str], baseline: str) -> list[str]:
    """Variants that count as compression against `baseline` (16-bit baselines exclude all dense baselines)."""
    excluded = {baseline} if baseline == "syncsgd" else set(DENSE_BASELINES)
    return [v for v in variants if base_compressor(v) not in excluded and v != baseline]


def headline(sp: pd.DataFrame, baseline: str) -> tuple[str, int, int]:
    """'Compression beat the baseline in n of m configurations (best: ...)': a win counts where the compressor is
    faster and the repeats decide it (not a tie, `tie_flags`); ties are counted apart."""
    # a configuration needs a gradient exchange: single-worker trials are scaling references, not counted
    rows = sp[
        sp["variant"].isin(counted_variants(sp["variant"].unique(), baseline))
        & sp["speedup"].notna()
        & (sp["world_size"] > 1)
    ]
    wins = rows[(rows["speedup"] > 1.0) & ~rows["tie"].astype(bool)]
    n, m, ties = len(wins), len(rows), int(rows["tie"].astype(bool).sum())
    text = f"Compression beat {baseline_description(baseline)} in {n} of {m} configurations"
    if n:
        best = wins.loc[wins["speedup"].idxmax()]
        text += (
            f" (best: {best['variant']} {best['speedup']:.2f}x on {group_label(best['model'], best['batch_size'], best['world_size'])}"
            f" at {fmt_rate(best['rate_bps'])})"
        )
    if ties:
        text += f"; {ties} {'is a tie' if ties == 1 else 'are ties'} (the repeated trials do not tell them apart)"
    return text + ".", n, m


def hardware_line(ok: pd.DataFrame) -> str:
    """What ran the trials, for the headline: machines, device, cores, and the co-locations (issue 32)."""
    def values(col: str) -> list[str]:
        return sorted({str(v) for v in ok[col].dropna()}) if col in ok.columns else []

    hosts, devices, cores, shared = values("hostname"), values("device_name"), values("cores"), values("colocation")
    text = f"Trials ran on {', '.join(hosts) or 'unrecorded hosts'}"
    if devices:
        text += f" ({', '.join(devices)}" + (f", {'/'.join(cores)} cores" if cores else "") + ")"
    return text + (f"; {', '.join(shared)}." if shared else ".")


def measured_crossover(
    rates_bps: Sequence[float], speedups: Sequence[float], ties: Sequence[bool] | None = None
) -> tuple[str, float | None]:
    """Crossover of measured speedup through 1.0 (perfmodel's rule, interpolated in log-log between shaped rates):
    ("crossover", B), ("always"/"never", None), or ("n/a", None) when fewer than two rates have a speedup.

    `ties`: per rate, whether the repeats cannot tell the compressor from the baseline there (`tie_flags`).
    The medians place the crossing; it stands as a crossover only when decided rates on both sides of it are on
    opposite sides of 1.0 (`decided_bracket`), else the answer is the decided rates' ("always"/"never": the medians
    cross among tied rates at the edge of the range). ("tie", None) when every rate is a tie (a noise-decided
    crossing is not a crossover to hold a model against)."""
    pts = _usable(rates_bps, speedups, ties)
    if len(pts) < 2:
        return "n/a", None
    decided = [(r, sp) for r, sp, t in pts if not t]
    if not decided:
        return "tie", None
    kind, b_star, _ = pm.crossover_from_samples([r for r, _, _ in pts], [sp for _, sp, _ in pts])
    if kind == "crossover" and decided_bracket(rates_bps, speedups, ties, b_star) is None:
        if all(sp > 1.0 for _, sp in decided):
            return "always", None
        if all(sp <= 1.0 for _, sp in decided):
            return "never", None
    return kind, b_star


def _usable(rates_bps, speedups, ties) -> list[tuple[float, float, bool]]:
    ties = list(ties) if ties is not None else [False] * len(rates_bps)
    return sorted((float(r), float(sp), bool(t)) for r, sp, t in zip(rates_bps, speedups, ties, strict=True)
                  if r and r > 0 and sp and sp > 0 and not math.isnan(sp))  # fmt: skip


def decided_bracket(
    rates_bps: Sequence[float], speedups: Sequence[float], ties: Sequence[bool] | None, b_bps: float
) -> tuple[float, float] | None:
    """The nearest decided (non-tie) rates below and above a measured crossing `b_bps`, when they are on opposite
    sides of 1.0: the measurement puts the crossover somewhere between them (adjacent rates without ties; wider
    where tied rates lie between). None when a side has no decided rate or both are on the same side."""
    decided = [(r, sp) for r, sp, t in _usable(rates_bps, speedups, ties) if not t]
    below = [(r, sp) for r, sp in decided if r <= b_bps]
    above = [(r, sp) for r, sp in decided if r > b_bps]
    if not below or not above or (below[-1][1] > 1.0) == (above[0][1] > 1.0):
        return None
    return below[-1][0], above[0][0]


def describe_crossover(kind: str, b: float | None, tie_rates: Sequence[str] = ()) -> str:
    text = pm.rate_text(b) if kind == "crossover" else ("tie at every rate" if kind == "tie" else kind)
    if tie_rates and kind != "tie":
        text += f" (tie at {', '.join(tie_rates)})"
    return text


# --------------------------------------------------------------------------------------------- verdicts
AGREE_LOW, AGREE_HIGH = 0.75, 1.33


def crossover_verdict(
    measured_kind: str,
    measured_bps: float | None,
    predicted_kind: str | None,
    predicted_bps: float | None,
    low_bps: float,
    high_bps: float,
    *,
    tied_bracket: tuple[float, float] | None = None,
    decided_bps: Sequence[float] = (),
    predicted_range: tuple[float, float] | None = None,
    measured_range: tuple[float, float] | None = None,
) -> tuple[float | None, str]:
    """(predicted / measured crossover, verdict) for one compressor; [low, high] is the measured range.

    A measured "always" or "never" means no crossing in the measured range: the model agrees when it also has none
    there (its crossover, if any, lies outside the range on the right side). Two crossovers agree when their ratio
    is within 0.75-1.33. With repeated trials (see `tie_flags`) the measurement only decides at its non-tied rates
    (`decided_bps`, rising): a measured crossover also agrees when the model's lies between the decided rates around
    it with tied rates between them (`tied_bracket`), and an "always"/"never" when the model crosses only among the
    tied rates beyond the last decided one on the side where a crossing can be."""
    if predicted_kind is None:
        return None, "no prediction (no profile)"
    if measured_kind == "n/a":
        return None, "n/a (fewer than two measured rates)"
    if measured_kind == "tie":
        return None, "undecided: a tie at every measured rate (the repeats cannot tell them apart); nothing to compare"
    inside = predicted_kind == "crossover" and predicted_bps is not None and low_bps <= predicted_bps <= high_bps
    if measured_kind == "crossover":
        if predicted_kind != "crossover" or predicted_bps is None:
            return None, f"disagrees: measured crossover, model says {predicted_kind} faster"
        ratio = predicted_bps / measured_bps
        by_interval = interval_verdict(ratio, predicted_range, measured_range or tied_bracket)
        if by_interval:
            return ratio, by_interval
        if AGREE_LOW <= ratio <= AGREE_HIGH:
            return ratio, f"agrees within {AGREE_LOW}-{AGREE_HIGH} ({ratio:.2f})"
        if tied_bracket and tied_bracket[0] < predicted_bps < tied_bracket[1]:
            lo, hi = (pm.rate_text(b) for b in tied_bracket)
            return ratio, f"agrees: between the decided rates {lo} and {hi}, the rates between them tied ({ratio:.2f})"
        return ratio, f"disagrees: predicted / measured {ratio:.2f}"
    what = "faster" if measured_kind == "always" else "slower"
    if inside and decided_bps:
        # the model (faster below its crossover) puts every decided rate on the measured side only when it crosses
        # beyond the last decided rate (always faster) or before the first (always slower): among tied rates
        beyond = predicted_bps > decided_bps[-1] if measured_kind == "always" else predicted_bps < decided_bps[0]
        if beyond:
            return None, (f"agrees: never among the decided rates (always {what}), model crosses at "
                          f"{pm.rate_text(predicted_bps)}, among the tied ones")  # fmt: skip
    if inside:
        return None, (
            f"disagrees: never in the measured range (always {what}), model crosses at {pm.rate_text(predicted_bps)}"
        )
    if predicted_kind in (measured_kind, "crossover"):
        beyond = f", model crosses at {pm.rate_text(predicted_bps)}" if predicted_kind == "crossover" else ""
        return None, f"agrees: never in the measured range (always {what}){beyond}"
    return None, f"disagrees: measured always {what}, model always {'slower' if what == 'faster' else 'faster'}"


UNDECIDED_SPAN = (AGREE_HIGH / AGREE_LOW) ** 2  # a predicted crossover interval wider than this ratio decides nothing


def interval_verdict(
    ratio: float, predicted: tuple[float, float] | None, measured: tuple[float, float] | None
) -> str | None:
    """The verdict by the intervals (issue 32), or None to fall back on the ratio alone: "undecided" when the
    predicted crossover's interval (the predictions' spread) spans more than `UNDECIDED_SPAN` (say why), "agrees"
    when it overlaps the measured one (the decided rates around the measured crossing), else None."""
    if predicted is None:
        return None
    lo, hi = predicted
    if lo > 0 and hi / lo > UNDECIDED_SPAN:
        return (f"undecided: the predicted crossover lies anywhere in {pm.rate_text(lo)}..{pm.rate_text(hi)} "
                f"(the profile's and calibration's spread), too wide to tell ({ratio:.2f})")  # fmt: skip
    if measured is not None and lo <= measured[1] and measured[0] <= hi:
        return (f"agrees: the predicted interval {pm.rate_text(lo)}..{pm.rate_text(hi)} overlaps the measured "
                f"{pm.rate_text(measured[0])}..{pm.rate_text(measured[1])} ({ratio:.2f})")  # fmt: skip
    return None


def measured_verdict(
    rates_bps: Sequence[float],
    speedups: Sequence[float],
    ties: Sequence[bool],
    measured: tuple[str, float | None],
    predicted_kind: str | None,
    predicted_bps: float | None,
    predicted_range: tuple[float, float] | None = None,
) -> tuple[float | None, str]:
    """`crossover_verdict` for one compressor's measured points (`measured`: what `measured_crossover` made of them):
    the measured range, the decided rates and, for a crossover, its decided bracket when tied rates lie inside it."""
    kind, b = measured
    pts = _usable(rates_bps, speedups, ties)
    rng = [r for r, _, _ in pts]
    bracket = decided_bracket(rates_bps, speedups, ties, b) if kind == "crossover" else None
    tied_inside = bracket is not None and any(
        bracket[0] < r < bracket[1] for r, t in zip(rates_bps, ties, strict=True) if t
    )
    decided = [r for r, _, t in pts if not t]
    return crossover_verdict(kind, b, predicted_kind, predicted_bps, min(rng), max(rng),
                             tied_bracket=bracket if tied_inside else None, decided_bps=decided,
                             predicted_range=predicted_range, measured_range=bracket)  # fmt: skip


def speedup_matrix(sp: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Wide table: one row per (model, batch, world, bandwidth), one column per compressor, cells 'N.NNx', '~N.NNx'
    where the repeats do not tell the compressor from the baseline there (`tie_flags`)."""
    d = sp.copy()
    d["bandwidth"] = [fmt_rate(r) for r in d["rate_bps"]]
    d["order"] = [(r == 0, r) for r in d["rate_bps"]]
    cols = sorted(d["variant"].unique(), key=variant_order)
    rows = []
    for (model, bs, ws, rate), g in d.groupby([*GROUP_KEYS, "rate_bps"], sort=False):
        row = {
            "model": model,
            "batch_size": int(bs),
            "world_size": int(ws),
            "bandwidth": fmt_rate(rate),
            "_r": (rate == 0, rate),
        }
        for v in cols:
            cell = g.loc[g["variant"] == v]
            sp_v = cell["speedup"].iloc[0] if len(cell) else math.nan
            tie = "~" if v != baseline and len(cell) and bool(cell["tie"].iloc[0]) else ""
            row[v] = f"{tie}{sp_v:.2f}x" if not math.isnan(sp_v) else "-"
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out = out.sort_values(["model", "batch_size", "world_size", "_r"]).drop(columns="_r")
    return out.reset_index(drop=True)
