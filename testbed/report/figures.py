"""Report figures (matplotlib, Agg backend): iteration time and speedup vs bandwidth with the model's curves,
scaling with workers, per-phase time. Each function draws one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from testbed import perfmodel as pm  # noqa: E402
from testbed.report.analysis import (  # noqa: E402
    base_compressor,
    baseline_description,
    counted_variants,
    describe_crossover,
    fmt_rate,
    group_label,
    is_serial,
    measured_crossover,
    measured_verdict,
    variant_order,
    variant_profile,
)
from testbed.report.predicted import ModelSettings, crossover_terms, effective_rate, network  # noqa: E402
from testbed.report.searches import report_variant  # noqa: E402

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


# --------------------------------------------------------------------------------------------- figures
def variant_colors(variants: Iterable[str]) -> dict[str, str]:
    return {v: _COLORS[i % len(_COLORS)] for i, v in enumerate(sorted(set(variants), key=variant_order))}


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
    searches: Sequence[dict] = (),
) -> tuple[Path, list[dict]]:
    """`searches`: the crossover searches of this group (report.searches): their rates ringed, their bracket shaded."""
    model, bs, ws = key
    unshaped_x, xpos = _x_positions(g["rate_bps"])
    fig = Figure(figsize=(9.5, 7.5))
    ax_t, ax_s = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    shaped = sorted(r for r in g["rate_bps"].unique() if r > 0)
    cx_rows: list[dict] = []
    variants = sorted(g["variant"].unique(), key=variant_order)
    grid = pm.log_grid(shaped[0] / 2, shaped[-1] * 2, 60) if shaped else []
    delay = float(g["delay_s"].median()) if g["delay_s"].notna().any() else 0.0
    curves = {}
    if prof is not None and grid:
        names = [v for v in variants if base_compressor(v) in prof.compressor_names()]
        for v in names:
            c = base_compressor(v)
            curves[v] = [
                pm.predict_iteration(
                    variant_profile(prof, v), c, network(ws, b, delay, s), hook_blocks_backward=s.hook_blocks_backward
                ).iter_time_s
                for b in grid
            ]
    base_curve = curves.get(baseline) if baseline in curves else None
    if prof is not None and grid and base_curve is None and baseline in prof.compressor_names():
        base_curve = [pm.predict_iteration(prof, baseline, network(ws, b, delay, s)).iter_time_s for b in grid]
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
        _mark_searches(ax_t, d, [x for x in searches if report_variant(x) == v], colors[v], xpos)
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
        rates = [effective_rate(r, gp) for r, gp in zip(d["rate_bps"], d["goodput_bps"], strict=True)]
        ties = [bool(t) for t in d["tie"]]
        mk, mb = measured_crossover(rates, list(d["speedup"]), ties)
        measured_range = [r for r, sp in zip(rates, d["speedup"], strict=True) if r > 0 and sp > 0]
        tie_rates = [fmt_rate(r) for r, t in zip(d["rate_bps"], ties, strict=True) if t]
        row = {
            "model": model,
            "batch_size": int(bs),
            "world_size": int(ws),
            "compressor": v,
            "measured": describe_crossover(mk, mb, tie_rates),
            "measured_bps": mb,
            "predicted": "no profile",
            "predicted_bps": None,
            "predicted/measured": None,
            "verdict": "no prediction (no profile)",
        }
        pkind = None
        if mb:
            ax_t.axvline(mb, color=colors[v], linestyle=":", linewidth=1.5)
            ax_s.axvline(mb, color=colors[v], linestyle=":", linewidth=1.5)
        if is_serial(v):
            row["predicted"] = "n/a (serial)"
        elif v in curves and base_curve is not None and shaped:
            lo_bps, hi_bps = shaped[0] / 10, shaped[-1] * 100
            pc = pm.crossover(
                prof,
                base_compressor(v),
                int(ws),
                lo_bps,
                hi_bps,
                baseline=baseline,
                hook_blocks_backward=s.hook_blocks_backward,
                terms=crossover_terms(int(ws), delay, s),
            )
            pkind = pc.kind
            row["predicted"] = (
                pc.describe()
                if pc.kind == "crossover"
                else f"{pc.kind} ({pm.rate_text(lo_bps)}..{pm.rate_text(hi_bps)})"
            )
            row["predicted_bps"] = pc.bandwidth_bps
            if pc.kind == "crossover":  # the rates where the two predictions' intervals overlap (issue 32)
                row["predicted_range_bps"] = pm.crossover_interval(
                    prof, base_compressor(v), int(ws), lo_bps, hi_bps, baseline=baseline,
                    hook_blocks_backward=s.hook_blocks_backward, terms=crossover_terms(int(ws), delay, s),
                    comm_rel_spread=s.terms(int(ws)).comm_rel_spread)  # fmt: skip
            if pc.bandwidth_bps and grid[0] <= pc.bandwidth_bps <= grid[-1]:
                ax_t.axvline(pc.bandwidth_bps, color=colors[v], linestyle="--", linewidth=1)
                ax_s.axvline(pc.bandwidth_bps, color=colors[v], linestyle="--", linewidth=1)
        if is_serial(v):
            row["verdict"] = "n/a (serial)"
        elif measured_range:
            ratio, verdict = measured_verdict(rates, list(d["speedup"]), ties, (mk, mb), pkind, row["predicted_bps"],
                                              row.pop("predicted_range_bps", None))  # fmt: skip
            row["predicted/measured"], row["verdict"] = ratio, verdict
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
        f"{group_label(model, bs, ws)}: iteration time vs bandwidth\n"
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


def _mark_searches(ax, d: pd.DataFrame, searches: Sequence[dict], color: str, xpos: dict) -> None:
    """Ring the rates a crossover search measured (on the variant's measured points) and shade its bracket."""
    for doc in searches:
        rates = {int(v["rate_bps"]) for v in doc.get("visits", [])}
        pts = d[d["rate_bps"].isin(rates)]
        if len(pts):
            ax.plot([xpos[r] for r in pts["rate_bps"]], pts["t_s"], "s", markersize=12, markerfacecolor="none",
                    markeredgecolor=color, label=f"{doc['variant']} searched")  # fmt: skip
        lo, hi = doc.get("bracket_bps") or (None, None)
        if doc.get("done") and lo and hi and hi > lo:
            ax.axvspan(lo, hi, color=color, alpha=0.15, label=f"{doc['variant']} {doc.get('kind')} bracket")


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
        notes.append(f"{group_label(model, bs)}: no 1-worker trial or profile; scaling plot has no ideal line")
    fig = Figure(figsize=(4.2 * len(rates) + 2.5, 7))
    axes = np.array(fig.subplots(2, len(rates), squeeze=False))
    p_grid = list(range(1, int(max(sizes)) + 1))
    for j, rate in enumerate(rates):
        ax_tp, ax_eff = axes[0, j], axes[1, j]
        d_rate = gm[gm["rate_bps"] == rate]
        for v in sorted(d_rate["variant"].unique(), key=variant_order):
            d = d_rate[d_rate["variant"] == v].sort_values("world_size")
            ax_tp.plot(d["world_size"], d["samples_per_s"], "o", color=colors[v], label=f"{v} measured")
            if single:
                ax_eff.plot(d["world_size"], d["samples_per_s"] / (d["world_size"] * single), "o", color=colors[v])
            c = base_compressor(v)
            if prof is not None and rate > 0 and c in prof.compressor_names():
                delay = float(d["delay_s"].median()) if d["delay_s"].notna().any() else 0.0
                tp = [
                    pm.predict_iteration(
                        variant_profile(prof, v),
                        c,
                        network(p, rate, delay, s),
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
    fig.suptitle(f"{group_label(model, bs)}: scaling per bandwidth (points measured, lines model)", fontsize=11)
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
        d = d.iloc[sorted(range(len(d)), key=lambda i: variant_order(d["variant"].iloc[i]))]
        x = np.arange(len(d))
        bottom = np.zeros(len(d))
        for name, cols, color in phases:
            vals = d[list(cols)].fillna(0).sum(axis=1).to_numpy(dtype=float) * 1e3
            ax.bar(x, vals, bottom=bottom, color=color, label=name)
            bottom += vals
        for name, col, color in (("communication hidden by backward", "comm_hidden_s", "#c44e52"),
                                 ("codec off the critical path", "codec_hidden_s", "#8172b3")):  # fmt: skip
            if col in d.columns:  # above the stack: work that cost no iteration time (issue 35's overlap split)
                vals = d[col].fillna(0).to_numpy(dtype=float) * 1e3
                if vals.any():
                    ax.bar(x, vals, bottom=bottom, color="none", edgecolor=color, hatch="///", label=name)
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
        f"{group_label(model, bs, ws)}: exposed time per phase (measured; the solid stacks add up to the iteration, "
        "hatched: hidden work above it)",
        fontsize=10,
    )
    _legend(axes[-1], *axes)
    return _save(fig, path)


def plot_calibration(calibration, path: Path) -> Path:
    """`testbed calibrate`'s figure: measured busbw per message size of each collective (nccl-tests style) with the
    fitted model's curve, and the host (CPU) time per collective beside its wall time."""
    from testbed.perfmodel.fit import bus_factor

    c = calibration
    f = c.fitted
    p = c.world_size
    fig = Figure(figsize=(11, 4.2))
    ax_bw, ax_t = fig.subplots(1, 2)
    fits = {"allreduce": f.allreduce_fit, "allgather": f.allgather_fit}
    for i, coll in enumerate(("allreduce", "allgather")):
        ss = sorted((s for s in c.samples if s.collective == coll), key=lambda s: s.n_bytes)
        if not ss:
            continue
        xs = np.array([s.n_bytes for s in ss], dtype=float)
        color = _COLORS[i]
        ax_bw.plot(xs, [s.busbw_bps / 1e9 for s in ss], "o", color=color, label=f"{coll} measured busbw")
        grid = np.geomspace(xs.min(), xs.max(), 50)
        model_t = fits[coll].intercept + fits[coll].slope * grid
        ax_bw.plot(grid, 8 * grid / model_t * bus_factor(coll, p) / 1e9, "-", color=color, label=f"{coll} fit")
        ax_t.plot(xs, [s.wall_s * 1e3 for s in ss], "o-", color=color, label=f"{coll} wall")
        ax_t.plot(xs, [s.cpu_s * 1e3 for s in ss], "x--", color=color, label=f"{coll} host CPU")
        busy = sorted((s for s in c.contention if s.collective == coll), key=lambda s: s.n_bytes)
        if busy:
            ax_t.plot([s.n_bytes for s in busy], [s.wall_s * 1e3 for s in busy], "s:", color=color,
                      label=f"{coll} wall beside compute")  # fmt: skip
    if c.rate_bps:
        ax_bw.axhline(c.rate_bps / 1e9, color="#7f7f7f", ls=":", label=f"shaped rate {fmt_rate(c.rate_bps)}")
    ax_bw.set_xscale("log")
    ax_bw.set_xlabel("message size (bytes)")
    ax_bw.set_ylabel("busbw (Gbit/s)")
    ax_bw.set_title(
        f"alpha {f.latency_s * 1e6:.3g} us, B_ar {fmt_rate(f.bandwidth_bps)}, B_ag {fmt_rate(f.allgather_bandwidth_bps)}",
        fontsize=9,
    )
    ax_t.set_xscale("log")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("message size (bytes)")
    ax_t.set_ylabel("time per collective (ms)")
    ax_t.set_title(
        f"host cost k {f.host_s_per_wire_byte * 1e9:.3g} ns/B wire, gamma {f.reduce_s_per_byte * 1e9:.3g} ns/B reduced; "
        f"beside compute +{f.contention_latency_s * 1e6:.3g} us/step, +{f.contention_s_per_wire_byte * 1e9:.3g} ns/B",
        fontsize=8,
    )
    for ax in (ax_bw, ax_t):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"calibration: cluster {c.cluster}, {c.backend}, {p} ranks", fontsize=10)
    return _save(fig, path)
