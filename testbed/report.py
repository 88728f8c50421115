"""Report: measured curves from the results store beside the performance model's prediction.

`build_report(df, out_dir, ...)` takes a results DataFrame (schema_version 1, one row per trial) and writes
PNG figures, `report.html` (figures embedded, opens without network) and `summary.md`, plus CSV tables.
`report_from_dir(results_dir, out_dir, ...)` reads the store with `testbed.results.load_results` first.

Only rows with status "ok" are plotted; the others are counted. Trials repeated with the same configuration are
pooled: the point is the median of their p50 iteration times, the error bar spans the lowest p5 to the highest p95.
`samples_per_s` is read as global throughput (all ranks together).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from shaping.units import format_rate  # noqa: E402
from testbed import perfmodel as pm  # noqa: E402
from testbed.errors import InputError  # noqa: E402

SCHEMA_VERSION = 1
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
DENSE_BASELINES = ("syncsgd", "fp16", "bf16")
GROUP_KEYS = ["model", "batch_size", "world_size"]
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    headline: str
    wins: int
    configurations: int
    notes: tuple[str, ...] = ()
    tables: dict = field(default_factory=dict, compare=False)


def baseline_description(baseline: str) -> str:
    if baseline == "syncsgd":
        return "fp32 sync SGD (syncsgd)"
    if baseline in ("fp16", "bf16"):
        return f"the 16-bit all-reduce baseline ({baseline})"
    raise InputError(f"--baseline {baseline}: expected one of {', '.join(DENSE_BASELINES)}")


def fmt_rate(bps: float) -> str:
    if not bps or (isinstance(bps, float) and math.isnan(bps)):
        return "unshaped"
    return format_rate(bps)


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


def _base(variant: str) -> str:
    """Compressor name of a variant label ('powersgd[rank=4] serial' -> 'powersgd')."""
    return variant.split("[")[0].split(" ")[0]


def _is_serial(variant: str) -> bool:
    return variant.endswith(" serial")


def _variant_profile(prof: pm.Profile, variant: str) -> pm.Profile:
    """The profile to predict a variant with: serial trials reduce the buckets only after backward."""
    return pm.serialized(prof) if _is_serial(variant) else prof


def _order_key(v: str) -> tuple:
    base = _base(v)
    return (pm.COMPRESSORS.index(base) if base in pm.COMPRESSORS else len(pm.COMPRESSORS), v)


def _group_label(model: str, batch_size: int, world_size: int | None = None) -> str:
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
    if SCHEMA_VERSION not in versions:
        raise InputError(
            f"results: schema_version {', '.join(map(str, versions)) or 'missing'} is not supported; "
            f"this report reads version {SCHEMA_VERSION}"
        )
    if len(versions) > 1:
        other = df["schema_version"] != SCHEMA_VERSION
        notes.append(
            f"{int(other.sum())} trial(s) with schema_version "
            f"{', '.join(str(v) for v in versions if v != SCHEMA_VERSION)} skipped "
            f"(mixed schema versions; this report reads version {SCHEMA_VERSION})"
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
            lo_s=("lo_s", "min"),
            hi_s=("hi_s", "max"),
            trials=("trial_id", "count"),
            samples_per_s=("samples_per_s", "median"),
            delay_s=("delay_s", "median"),
            **{c: (c, "mean") for c in PHASE_COLUMNS},
        )
        .reset_index()
    )
    return agg


# --------------------------------------------------------------------------------------------- speedups
def speedup_table(agg: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list[str]]:
    """Adds `speedup` (baseline time / time at the same group and rate); notes groups without a baseline."""
    notes = []
    base = agg[agg["variant"] == baseline][[*GROUP_KEYS, "rate_bps", "t_s"]].rename(columns={"t_s": "base_t_s"})
    out = agg.merge(base, on=[*GROUP_KEYS, "rate_bps"], how="left")
    out["speedup"] = out["base_t_s"] / out["t_s"]
    for key, g in out.groupby(GROUP_KEYS):
        if g["base_t_s"].isna().all():
            notes.append(f"{_group_label(*key)}: no ok {baseline} trials; reported without speedups")
        elif g["base_t_s"].isna().any():
            rates = sorted({fmt_rate(r) for r in g.loc[g["base_t_s"].isna(), "rate_bps"]})
            notes.append(f"{_group_label(*key)}: no ok {baseline} trials at {', '.join(rates)}; no speedups there")
    return out, notes


def counted_variants(variants: Iterable[str], baseline: str) -> list[str]:
    """Variants that count as compression against `baseline` (16-bit baselines exclude all dense baselines)."""
    excluded = {baseline} if baseline == "syncsgd" else set(DENSE_BASELINES)
    return [v for v in variants if _base(v) not in excluded and v != baseline]


def headline(sp: pd.DataFrame, baseline: str) -> tuple[str, int, int]:
    # a configuration needs a gradient exchange: single-worker trials are scaling references, not counted
    rows = sp[
        sp["variant"].isin(counted_variants(sp["variant"].unique(), baseline))
        & sp["speedup"].notna()
        & (sp["world_size"] > 1)
    ]
    n, m = int((rows["speedup"] > 1.0).sum()), len(rows)
    text = f"Compression beat {baseline_description(baseline)} in {n} of {m} configurations"
    if m:
        best = rows.loc[rows["speedup"].idxmax()]
        text += (
            f" (best: {best['variant']} {best['speedup']:.2f}x on {_group_label(best['model'], best['batch_size'], best['world_size'])}"
            f" at {fmt_rate(best['rate_bps'])})"
        )
    return text + ".", n, m


def measured_crossover(rates_bps: Sequence[float], speedups: Sequence[float]) -> tuple[str, float | None]:
    """Crossover of measured speedup through 1.0 (perfmodel's rule, interpolated in log-log between shaped rates):
    ("crossover", B), ("always"/"never", None), or ("n/a", None) when fewer than two rates have a speedup."""
    kind, b_star, _ = pm.crossover_from_samples(rates_bps, speedups)
    return kind, b_star


def _describe_cx(kind: str, b: float | None) -> str:
    if kind == "crossover":
        return pm.rate_text(b)
    return kind


# --------------------------------------------------------------------------------------------- predictions
@dataclass(frozen=True)
class ModelSettings:
    latency_s: float = 50e-6
    efficiency: float = 1.0
    hook_blocks_backward: bool = True


def _net(ws: int, bps: float, delay_s: float, s: ModelSettings) -> pm.Network:
    d = 0.0 if delay_s is None or (isinstance(delay_s, float) and math.isnan(delay_s)) else float(delay_s)
    return pm.Network(int(ws), float(bps), s.latency_s + d, s.efficiency)


def prediction_errors(ok: pd.DataFrame, profiles: Sequence[pm.Profile], s: ModelSettings) -> pd.DataFrame:
    """Per ok trial: predicted vs measured iteration time (unshaped trials use their measured goodput)."""
    rows = []
    for _, r in ok.iterrows():
        prof = pm.pick_profile(profiles, r["model"], int(r["batch_size"]))
        if prof is None or r["compressor"] not in prof.compressor_names():
            continue
        bps = r["rate_bps"] if r["rate_bps"] > 0 else r.get("measured_goodput_bps")
        if not bps or (isinstance(bps, float) and math.isnan(bps)):
            continue
        pred = pm.predict_iteration(
            _variant_profile(prof, r["variant"]),
            r["compressor"],
            _net(r["world_size"], bps, r["delay_s"], s),
            hook_blocks_backward=s.hook_blocks_backward,
        ).iter_time_s
        rows.append(
            {
                "trial_id": r["trial_id"],
                "model": r["model"],
                "batch_size": int(r["batch_size"]),
                "world_size": int(r["world_size"]),
                "bandwidth": fmt_rate(r["rate_bps"]),
                "compressor": r["variant"],
                "measured_ms": r["t_s"] * 1e3,
                "predicted_ms": pred * 1e3,
                "error_pct": (pred - r["t_s"]) / r["t_s"] * 100,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "trial_id",
            "model",
            "batch_size",
            "world_size",
            "bandwidth",
            "compressor",
            "measured_ms",
            "predicted_ms",
            "error_pct",
        ],
    )


def fit_efficiency_from_trials(
    ok: pd.DataFrame, profiles: Sequence[pm.Profile], latency_s: float, hook_blocks_backward: bool = True
) -> tuple[float | None, int]:
    """Efficiency that makes predicted syncsgd iteration times match the measured ones (median over trials).

    Uses shaped syncsgd trials whose prediction at efficiency 1 is communication-bound (exposed time at least half
    the iteration), so compute noise does not masquerade as bandwidth. Returns (efficiency or None, trials used).
    """
    fits = []
    s1 = ModelSettings(latency_s, 1.0, hook_blocks_backward)
    picked = ok[(ok["variant"] == "syncsgd") & (ok["rate_bps"] > 0)]
    for _, r in picked.iterrows():
        prof = pm.pick_profile(profiles, r["model"], int(r["batch_size"]))
        if prof is None or int(r["world_size"]) < 2:
            continue

        def t(eff: float, r=r, prof=prof) -> float:
            net = _net(r["world_size"], r["rate_bps"], r["delay_s"], ModelSettings(latency_s, eff))
            return pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=s1.hook_blocks_backward).iter_time_s

        full = pm.predict_iteration(prof, "syncsgd", _net(r["world_size"], r["rate_bps"], r["delay_s"], s1))
        if full.exposed_s < 0.5 * full.iter_time_s:
            continue
        if r["t_s"] <= full.iter_time_s:
            fits.append(1.0)
            continue
        lo, hi = 1e-4, 1.0  # t(eff) decreases with eff
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if t(mid) < r["t_s"] else (mid, hi)
        fits.append(0.5 * (lo + hi))
    if not fits:
        return None, 0
    return float(np.median(fits)), len(fits)


# --------------------------------------------------------------------------------------------- figures
def _colors(variants: Iterable[str]) -> dict[str, str]:
    return {v: _COLORS[i % len(_COLORS)] for i, v in enumerate(sorted(set(variants), key=_order_key))}


def _x_positions(rates: Iterable[int]) -> tuple[float, dict[int, float]]:
    shaped = sorted(r for r in set(rates) if r > 0)
    unshaped_x = (shaped[-1] * 4.0) if shaped else 1e10
    return unshaped_x, {r: (float(r) if r > 0 else unshaped_x) for r in set(rates)}


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight", metadata={"Software": None})
    return path


def _legend(ax, *more) -> None:
    """One legend right of `ax`, outside the data, with the unique entries of `ax` and `more` axes."""
    seen: dict[str, object] = {}
    for a in (ax, *more):
        for h, label in zip(*a.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    if seen:
        ax.legend(
            list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
        )


def plot_time_vs_bandwidth(
    g: pd.DataFrame,
    key: tuple,
    baseline: str,
    colors: dict[str, str],
    prof: pm.Profile | None,
    s: ModelSettings,
    path: Path,
) -> tuple[Path, list[dict]]:
    model, bs, ws = key
    unshaped_x, xpos = _x_positions(g["rate_bps"])
    fig = Figure(figsize=(9.5, 7.5))
    ax_t, ax_s = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    shaped = sorted(r for r in g["rate_bps"].unique() if r > 0)
    cx_rows: list[dict] = []
    variants = sorted(g["variant"].unique(), key=_order_key)
    grid = pm.log_grid(shaped[0] / 2, shaped[-1] * 2, 60) if shaped else []
    delay = float(g["delay_s"].median()) if g["delay_s"].notna().any() else 0.0
    curves = {}
    if prof is not None and grid:
        names = [v for v in variants if _base(v) in prof.compressor_names()]
        for v in names:
            c = _base(v)
            curves[v] = [
                pm.predict_iteration(
                    _variant_profile(prof, v), c, _net(ws, b, delay, s), hook_blocks_backward=s.hook_blocks_backward
                ).iter_time_s
                for b in grid
            ]
    base_curve = curves.get(baseline) if baseline in curves else None
    if prof is not None and grid and base_curve is None and baseline in prof.compressor_names():
        base_curve = [pm.predict_iteration(prof, baseline, _net(ws, b, delay, s)).iter_time_s for b in grid]
    for v in variants:
        d = g[g["variant"] == v].sort_values("rate_bps")
        x = [xpos[r] for r in d["rate_bps"]]
        yerr = [d["t_s"] - d["lo_s"], d["hi_s"] - d["t_s"]]
        ax_t.errorbar(
            x,
            d["t_s"],
            yerr=np.clip(np.array(yerr, dtype=float), 0, None),
            fmt="o",
            color=colors[v],
            capsize=3,
            label=f"{v} measured",
        )
        if v in curves:
            ax_t.plot(grid, curves[v], "-", color=colors[v], alpha=0.7, label=f"{v} model")
        if d["speedup"].notna().any():
            ax_s.plot(x, d["speedup"], "o", color=colors[v], label=v)
        if v in curves and base_curve is not None and v != baseline:
            ax_s.plot(
                grid, [b / c for b, c in zip(base_curve, curves[v], strict=True)], "-", color=colors[v], alpha=0.6
            )
        if v not in counted_variants([v], baseline):
            continue
        mk, mb = measured_crossover(list(d["rate_bps"]), list(d["speedup"]))
        row = {
            "model": model,
            "batch_size": int(bs),
            "world_size": int(ws),
            "compressor": v,
            "measured": _describe_cx(mk, mb),
            "measured_bps": mb,
            "predicted": "no profile",
            "predicted_bps": None,
        }
        if mb:
            ax_t.axvline(mb, color=colors[v], linestyle=":", linewidth=1.5)
            ax_s.axvline(mb, color=colors[v], linestyle=":", linewidth=1.5)
        if _is_serial(v):
            row["predicted"] = "n/a (serial)"
        elif v in curves and base_curve is not None and shaped:
            lo_bps, hi_bps = shaped[0] / 10, shaped[-1] * 100
            pc = pm.crossover(
                prof,
                _base(v),
                int(ws),
                lo_bps,
                hi_bps,
                baseline=baseline,
                latency_s=s.latency_s + delay,
                efficiency=s.efficiency,
                hook_blocks_backward=s.hook_blocks_backward,
            )
            row["predicted"] = (
                pc.describe() if pc.kind == "crossover" else f"{pc.kind} ({pm.rate_text(lo_bps)}..{pm.rate_text(hi_bps)})"
            )
            row["predicted_bps"] = pc.bandwidth_bps
            if pc.bandwidth_bps and grid[0] <= pc.bandwidth_bps <= grid[-1]:
                ax_t.axvline(pc.bandwidth_bps, color=colors[v], linestyle="--", linewidth=1)
                ax_s.axvline(pc.bandwidth_bps, color=colors[v], linestyle="--", linewidth=1)
        cx_rows.append(row)
    ax_s.axhline(1.0, color="black", linewidth=1)
    sp_vals = g["speedup"].dropna()
    if len(sp_vals) and (sp_vals.max() / max(sp_vals.min(), 1e-12) > 10):
        ax_s.set_yscale("log")
    for ax in (ax_t, ax_s):
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if (g["rate_bps"] == 0).any():
            ax.axvline(unshaped_x / 2, color="grey", linewidth=0.8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("iteration time (s, p50; bars p5-p95)")
    ax_s.set_ylabel(f"speedup over {baseline} (x)")
    ax_s.set_xlabel("link bandwidth (bit/s, log)" + ("; rightmost: unshaped" if (g["rate_bps"] == 0).any() else ""))
    ax_t.set_title(
        f"{_group_label(model, bs, ws)}: iteration time vs bandwidth\n"
        "points measured, lines model; vertical: crossover (dotted measured, dashed model)",
        fontsize=10,
    )
    ax_s.set_title(f"speedup over {baseline_description(baseline)}", fontsize=10)
    if (g["rate_bps"] == 0).any():
        ax_s.annotate(
            "unshaped", (unshaped_x, 1.0), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8
        )
    _legend(ax_t)
    _legend(ax_s)
    return _save(fig, path), cx_rows


def plot_scaling(
    gm: pd.DataFrame,
    key: tuple,
    colors: dict[str, str],
    prof: pm.Profile | None,
    s: ModelSettings,
    path: Path,
    notes: list[str],
) -> Path | None:
    model, bs = key
    sizes = sorted(gm["world_size"].unique())
    if len(sizes) < 2:
        return None
    rates = sorted(gm["rate_bps"].unique(), key=lambda r: (r == 0, r))
    single = None
    one = gm[(gm["world_size"] == 1) & gm["samples_per_s"].notna()]
    if not one.empty:
        single = float(one["samples_per_s"].median())
    elif prof is not None:
        single = prof.batch_size / prof.compute_s
    else:
        notes.append(f"{_group_label(model, bs)}: no 1-worker trial or profile; scaling plot has no ideal line")
    fig = Figure(figsize=(4.2 * len(rates) + 2.5, 7))
    axes = np.array(fig.subplots(2, len(rates), squeeze=False))
    p_grid = list(range(1, int(max(sizes)) + 1))
    for j, rate in enumerate(rates):
        ax_tp, ax_eff = axes[0, j], axes[1, j]
        d_rate = gm[gm["rate_bps"] == rate]
        for v in sorted(d_rate["variant"].unique(), key=_order_key):
            d = d_rate[d_rate["variant"] == v].sort_values("world_size")
            ax_tp.plot(d["world_size"], d["samples_per_s"], "o", color=colors[v], label=f"{v} measured")
            if single:
                ax_eff.plot(d["world_size"], d["samples_per_s"] / (d["world_size"] * single), "o", color=colors[v])
            c = _base(v)
            if prof is not None and rate > 0 and c in prof.compressor_names():
                delay = float(d["delay_s"].median()) if d["delay_s"].notna().any() else 0.0
                tp = [
                    pm.predict_iteration(
                        _variant_profile(prof, v),
                        c,
                        _net(p, rate, delay, s),
                        hook_blocks_backward=s.hook_blocks_backward,
                    ).samples_per_s
                    for p in p_grid
                ]
                ax_tp.plot(p_grid, tp, "-", color=colors[v], alpha=0.6, label=f"{v} model")
                if single:
                    ax_eff.plot(
                        p_grid,
                        [t / (p * single) for t, p in zip(tp, p_grid, strict=True)],
                        "-",
                        color=colors[v],
                        alpha=0.6,
                    )
        if single:
            ax_tp.plot(p_grid, [p * single for p in p_grid], "k--", linewidth=1, label="ideal linear")
            ax_eff.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax_tp.set_title(f"{fmt_rate(rate)}", fontsize=10)
        ax_tp.set_yscale("log")
        if j == 0:
            ax_tp.set_ylabel("throughput (samples/s, all workers, log)")
            ax_eff.set_ylabel("scaling efficiency (fraction of linear)")
        ax_eff.set_xlabel("workers")
        for ax in (ax_tp, ax_eff):
            ax.grid(True, alpha=0.3)
            ax.set_xticks(sorted({1, *(int(x) for x in sizes)}))
    fig.suptitle(f"{_group_label(model, bs)}: scaling per bandwidth (points measured, lines model)", fontsize=11)
    _legend(axes[0, -1], *axes.ravel())
    return _save(fig, path)


def plot_phases(g: pd.DataFrame, key: tuple, path: Path) -> Path:
    model, bs, ws = key
    rates = sorted(g["rate_bps"].unique(), key=lambda r: (r == 0, r))
    fig = Figure(figsize=(max(4.0, 3.2 * len(rates)) + 2, 4.8))
    axes = np.atleast_1d(fig.subplots(1, len(rates), squeeze=False)[0])
    phases = [
        ("compute (fwd+bwd+opt)", ("forward_s", "backward_s", "optimizer_s"), "#4c72b0"),
        ("encode", ("encode_s",), "#dd8452"),
        ("communication", ("comm_s",), "#c44e52"),
        ("decode", ("decode_s",), "#8172b3"),
    ]
    for ax, rate in zip(axes, rates, strict=True):
        d = g[g["rate_bps"] == rate].copy()
        d = d.iloc[sorted(range(len(d)), key=lambda i: _order_key(d["variant"].iloc[i]))]
        x = np.arange(len(d))
        bottom = np.zeros(len(d))
        for name, cols, color in phases:
            vals = d[list(cols)].fillna(0).sum(axis=1).to_numpy(dtype=float) * 1e3
            ax.bar(x, vals, bottom=bottom, color=color, label=name)
            bottom += vals
        ax.plot(
            x, d["t_s"].to_numpy(dtype=float) * 1e3, "k_", markersize=18, markeredgewidth=2, label="iteration (p50)"
        )
        ax.set_xticks(x, list(d["variant"]), rotation=45, ha="right", fontsize=8)
        ax.set_title(fmt_rate(rate), fontsize=10)
        if ax is axes[0]:
            ax.set_ylabel("time per iteration (ms)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(
        f"{_group_label(model, bs, ws)}: exposed time per phase (measured; stacks add up to the iteration)", fontsize=10
    )
    _legend(axes[-1], *axes)
    return _save(fig, path)


# --------------------------------------------------------------------------------------------- tables / output
def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_cell(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).replace("|", "/")


def speedup_matrix(sp: pd.DataFrame) -> pd.DataFrame:
    """Wide table: one row per (model, batch, world, bandwidth), one column per compressor, cells 'N.NNx'."""
    d = sp.copy()
    d["bandwidth"] = [fmt_rate(r) for r in d["rate_bps"]]
    d["order"] = [(r == 0, r) for r in d["rate_bps"]]
    cols = sorted(d["variant"].unique(), key=_order_key)
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
            s = g.loc[g["variant"] == v, "speedup"]
            row[v] = f"{s.iloc[0]:.2f}x" if len(s) and not math.isnan(s.iloc[0]) else "-"
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out = out.sort_values(["model", "batch_size", "world_size", "_r"]).drop(columns="_r")
    return out.reset_index(drop=True)


def _html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    return df.to_html(index=False, border=0, classes="t", float_format=lambda x: f"{x:.3g}", na_rep="-")


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}table.t{border-collapse:collapse;font-size:13px}
table.t td,table.t th{border:1px solid #ccc;padding:3px 8px;text-align:right}h1{font-size:1.5em}
.headline{font-size:1.2em;font-weight:bold;background:#eef;padding:.5em}img{max-width:100%}"""


def build_report(
    df: pd.DataFrame,
    out_dir: str | Path,
    *,
    baseline: str = "syncsgd",
    profiles: Sequence[pm.Profile] = (),
    latency_s: float = 50e-6,
    efficiency: float | str = 1.0,
    hook_blocks_backward: bool = True,
) -> ReportResult:
    """Write figures, report.html and summary.md for a results frame. Raises InputError on unusable input.

    `efficiency="auto"` fits it from the communication-bound syncsgd trials (1.0 when there are none).
    """
    desc = baseline_description(baseline)
    auto = efficiency == "auto"
    if not auto and not isinstance(efficiency, int | float):
        raise InputError(f"efficiency {efficiency!r}: expected a fraction in (0, 1] or 'auto'")
    pm.Network(1, 1.0, latency_s, 1.0 if auto else efficiency)  # validates latency and efficiency before any work
    ok, notes, counts = check_results(df)
    if auto:
        fitted, used = fit_efficiency_from_trials(ok, profiles, latency_s, hook_blocks_backward)
        if fitted is None:
            efficiency = 1.0
            notes.append("efficiency auto: no communication-bound syncsgd trial with a profile; used 1.0")
        else:
            efficiency = fitted
            notes.append(f"efficiency fitted from {used} syncsgd trial(s): {fitted:.3f}")
    s = ModelSettings(latency_s, efficiency, hook_blocks_backward)
    agg = aggregate(ok)
    sp, sp_notes = speedup_table(agg, baseline)
    notes += sp_notes
    head, wins, configs = headline(sp, baseline)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    colors = _colors(sp["variant"])
    figures: list[tuple[str, Path]] = []
    cx_rows: list[dict] = []
    models_without_profile = set()
    for key, g in sp.groupby(GROUP_KEYS):
        model, bs, ws = key
        prof = pm.pick_profile(profiles, model, int(bs))
        if prof is None:
            models_without_profile.add(model)
        elif prof.batch_size != int(bs):
            notes.append(f"{_group_label(model, bs)}: predicted with the bs{prof.batch_size} profile")
        stem = f"{model}_bs{int(bs)}_p{int(ws)}"
        path, rows = plot_time_vs_bandwidth(g, key, baseline, colors, prof, s, out / f"time_vs_bw_{stem}.png")
        figures.append((f"{_group_label(*key)}: iteration time and speedup vs bandwidth", path))
        cx_rows += rows
        figures.append((f"{_group_label(*key)}: per-phase time", plot_phases(g, key, out / f"phases_{stem}.png")))
    for (model, bs), gm in sp.groupby(["model", "batch_size"]):
        prof = pm.pick_profile(profiles, model, int(bs))
        p = plot_scaling(gm, (model, bs), colors, prof, s, out / f"scaling_{model}_bs{int(bs)}.png", notes)
        if p is not None:
            figures.append((f"{_group_label(model, bs)}: scaling", p))
    for m in sorted(models_without_profile):
        notes.append(f"{m}: no profile found; measured points only (run `testbed profile --model {m}`)")
    matrix = speedup_matrix(sp)
    errors = prediction_errors(ok, profiles, s)
    crossovers = pd.DataFrame(
        cx_rows,
        columns=[
            "model",
            "batch_size",
            "world_size",
            "compressor",
            "measured",
            "predicted",
            "measured_bps",
            "predicted_bps",
        ],
    )
    matrix.to_csv(out / "speedups.csv", index=False)
    errors.to_csv(out / "prediction_error.csv", index=False)
    crossovers.to_csv(out / "crossovers.csv", index=False)
    status_line = f"{sum(counts.values())} trial(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    settings = (
        f"model settings: latency {latency_s * 1e6:.0f} us (+ per-trial delay), efficiency {efficiency:.3g}, "
        f"hooks {'block' if hook_blocks_backward else 'overlap'} backward; "
        f"profiles used: {', '.join(sorted({f'{p.model} bs{p.batch_size} ({p.device})' for p in profiles})) or 'none'}"
    )
    err_summary = (
        errors.assign(abs_error_pct=errors["error_pct"].abs())
        .groupby("compressor")["abs_error_pct"]
        .median()
        .reset_index()
        .rename(columns={"abs_error_pct": "median abs error %"})
        if not errors.empty
        else pd.DataFrame()
    )
    cx_show = crossovers.drop(columns=["measured_bps", "predicted_bps"])

    md = [
        f"# Gradient compression report\n\n**{head}**\n",
        f"Baseline: {desc}. Speedup = baseline iteration time / "
        f"compressor iteration time at the same model, batch, workers and bandwidth.\n",
        f"{status_line}.\n",
        f"{settings}.\n",
    ]
    if notes:
        md.append("## Notes\n\n" + "".join(f"- {n}\n" for n in notes))
    md += [
        "## Speedup matrix\n",
        _md_table(matrix),
        "## Crossover bandwidth (measured vs predicted)\n",
        _md_table(cx_show),
        "## Prediction error (median |predicted - measured| / measured per compressor)\n",
        _md_table(err_summary),
        "Per-trial errors: `prediction_error.csv`.\n",
        "## Figures\n",
    ]
    md += [f"- {title}: ![{title}]({p.name})\n" for title, p in figures]
    (out / "summary.md").write_text("\n".join(md))

    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Gradient compression report</title>"
        f"<style>{_CSS}</style></head><body><h1>Gradient compression report</h1>",
        f"<p class='headline'>{html.escape(head)}</p><p>Baseline: {html.escape(desc)}. "
        f"{html.escape(status_line)}. {html.escape(settings)}.</p>",
    ]
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts += [
        "<h2>Speedup matrix</h2>",
        _html_table(matrix),
        "<h2>Crossover bandwidth</h2>",
        _html_table(cx_show),
        "<h2>Figures</h2>",
    ]
    for title, p in figures:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        parts.append(
            f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"
        )
    parts += ["<h2>Prediction error per trial</h2>", _html_table(errors), "</body></html>"]
    (out / "report.html").write_text("\n".join(parts))
    return ReportResult(
        out,
        out / "report.html",
        out / "summary.md",
        tuple(p for _, p in figures),
        head,
        wins,
        configs,
        tuple(notes),
        {"speedups": matrix, "errors": errors, "crossovers": crossovers},
    )


def load_results_dir(results_dir: str | Path) -> pd.DataFrame:
    """Read a results directory through the results store (`testbed.results.load_results`)."""
    from testbed.results import load_results

    return load_results(results_dir)


def report_from_dir(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    baseline: str = "syncsgd",
    profiles_dir: str | Path | None = None,
    **kwargs,
) -> ReportResult:
    baseline_description(baseline)
    profiles = pm.find_profiles(profiles_dir) if profiles_dir else []
    return build_report(load_results_dir(results_dir), out_dir, baseline=baseline, profiles=profiles, **kwargs)
