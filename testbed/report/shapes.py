"""Cluster shapes in the report (issue 36): trials with a straggler link, cross traffic or racks are kept apart from
the flat curves (a straggler trial at --bw 1gbit is not a 1 Gbit/s point), and drawn as iteration time against the
straggler's rate, per compressor, beside the flat trial at the same rate, measured and predicted.

The prediction of a straggler trial: a ring steps at the pace of its slowest link (perfmodel.ring_bottleneck), so it is
the flat prediction at the straggler's rate (compute unchanged), with the terms calibrated at that rate; the bounding
link is the straggler's."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from testbed import perfmodel as pm
from testbed.report.analysis import fmt_rate
from testbed.report.predicted import ModelSettings, predicted_iteration

SHAPE_COLUMNS = ("host_rates", "cross_traffic", "racks")


def is_shaped(df: pd.DataFrame) -> pd.Series:
    """Rows whose trial had a per-host rate, cross traffic or racks (older rows lack the columns: flat)."""
    mask = pd.Series(False, index=df.index)
    if "host_rates" in df:
        mask |= df["host_rates"].notna()
    if "cross_traffic" in df:
        mask |= df["cross_traffic"].fillna(0) > 0
    if "racks" in df:
        mask |= df["racks"].fillna(1) > 1
    return mask


def split_shapes(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(flat rows, shaped rows)."""
    mask = is_shaped(ok)
    return ok[~mask], ok[mask]


STRAGGLER_COLUMNS = ["model", "batch_size", "world_size", "rate_bps", "variant", "straggler_bps", "trials",
                     "measured_ms", "predicted_ms", "error_pct", "bounding_link"]  # fmt: skip


def _slowest_host(host_rates: str | None, rate_bps: float) -> str:
    """The host whose link bounds the ring (the slowest of --host-bw below the trial's rate), or 'every host link'."""
    rates = {h: r for h, r in json.loads(host_rates or "{}").items() if r is not None and (not rate_bps or r < rate_bps)}
    return f"{min(rates, key=rates.get)} link" if rates else "every host link (flat)"


def straggler_points(flat: pd.DataFrame, shaped: pd.DataFrame, profiles: Sequence[pm.Profile] = (),
                     s: ModelSettings | None = None) -> pd.DataFrame:  # fmt: skip
    """Per (model, batch size, world size, rate, variant, straggler rate): the median measured iteration time over the
    trials with a straggler link (no cross traffic) and the flat trials at the rate (straggler_bps = the rate), and the
    predicted one where a profile of the model has the compressor (NaN otherwise)."""
    s = s or ModelSettings()
    cols = ["model", "batch_size", "world_size", "rate_bps"]
    if shaped.empty or "min_host_rate_bps" not in shaped:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    rows = shaped[shaped["host_rates"].notna() & (shaped["cross_traffic"].fillna(0) == 0)]
    keys = rows[cols].drop_duplicates()
    base = flat.merge(keys, on=cols).assign(min_host_rate_bps=lambda d: d["rate_bps"], host_rates=None)
    both = pd.concat([rows, base], ignore_index=True)
    out = []
    for (model, bs, ws, rate, variant, slow), g in both.groupby([*cols, "variant", "min_host_rate_bps"]):
        measured = float(g["t_s"].median())
        full = predicted_iteration(profiles, s, model, bs, ws, variant, g["compressor"].iloc[0], float(slow),
                                   g["delay_s"].median())  # fmt: skip
        predicted = full[0].iter_time_s if full else math.nan
        out.append({"model": model, "batch_size": int(bs), "world_size": int(ws), "rate_bps": rate,
                    "variant": variant, "straggler_bps": slow, "trials": len(g), "measured_ms": measured * 1e3,
                    "predicted_ms": predicted * 1e3, "error_pct": (predicted - measured) / measured * 100,
                    "bounding_link": _slowest_host(g["host_rates"].iloc[0], rate)})  # fmt: skip
    return pd.DataFrame(out, columns=STRAGGLER_COLUMNS)


def straggler_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    """One figure per (model, batch size, world size, rate) of `straggler_points`: the median iteration time against
    the slowest host's rate, a line per compressor (measured: solid with markers, predicted: dashed), the flat trial
    at the rate as its right end."""
    if points.empty:
        return []
    from matplotlib.figure import Figure

    figures = []
    for (model, bs, ws, rate), g in points.groupby(["model", "batch_size", "world_size", "rate_bps"]):
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for variant, gc in g.groupby("variant"):
            pts = gc.sort_values("straggler_bps")
            (line,) = ax.plot(pts["straggler_bps"] / 1e6, pts["measured_ms"], marker="o", label=variant)
            if pts["predicted_ms"].notna().any():
                ax.plot(pts["straggler_bps"] / 1e6, pts["predicted_ms"], linestyle="--", color=line.get_color(),
                        label=f"{variant} (predicted)")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("straggler link rate (Mbit/s)")
        ax.set_ylabel("iteration time (ms, median)")
        ax.set_title(f"{model} bs{int(bs)}, {int(ws)} ranks, others at {fmt_rate(rate)}")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = out / f"straggler_{model}_bs{int(bs)}_p{int(ws)}_{int(rate)}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        figures.append((f"{model} bs{int(bs)}, {int(ws)} ranks: iteration time vs the straggler's rate", path))
    return figures


def straggler_markdown(points: pd.DataFrame) -> str:
    """The straggler section of summary.md: measured against predicted, with the link that bounded the ring."""
    lines = ["", "## Straggler links", "",
             "| workload | ranks | others at | compressor | straggler | trials | measured ms | predicted ms | error "
             "| bounding link |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in points.sort_values(["model", "batch_size", "world_size", "rate_bps", "variant", "straggler_bps"])\
            .itertuples():  # fmt: skip
        pred = "" if math.isnan(r.predicted_ms) else f"{r.predicted_ms:.0f}"
        err = "" if math.isnan(r.error_pct) else f"{r.error_pct:+.0f} %"
        lines.append(f"| {r.model} bs{r.batch_size} | {r.world_size} | {fmt_rate(r.rate_bps)} | {r.variant} "
                     f"| {fmt_rate(r.straggler_bps)} | {r.trials} | {r.measured_ms:.0f} | {pred} | {err} "
                     f"| {r.bounding_link} |")  # fmt: skip
    return "\n".join(lines) + "\n"
