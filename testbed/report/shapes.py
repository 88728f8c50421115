"""Cluster shapes in the report (issue 36): trials with a straggler link, cross traffic or racks are kept apart from
the flat curves (a straggler trial at --bw 1gbit is not a 1 Gbit/s point), and drawn per compressor, measured and
predicted, with the link that bounded the ring:

- straggler trials against the straggler's rate, the flat trial at the same rate as the right end;
- rack trials against the oversubscription (a rack's host rates over its uplink);
- cross-traffic trials against the number of flows, the flat trial at the same rate as 0 flows.

The prediction of a straggler or rack trial: a ring steps at the pace of its slowest link (perfmodel.ring_bottleneck:
the slowest host link, the spine's share per cross-rack ring step), so it is the flat prediction at that link's rate
(compute unchanged), with the terms calibrated at that rate. A cross-traffic trial is predicted with the terms of a
calibration measured beside as many flows (`testbed calibrate --cross-traffic N`: what the flows leave a collective
of each size, their standing queue included), and not predicted without one (said in the bounding-link column). A
trial that combines shapes (a straggler beside cross traffic, racks with either) is counted in a note, not drawn."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from testbed import perfmodel as pm
from testbed import trial_shape
from testbed.report.analysis import fmt_rate
from testbed.report.predicted import ModelSettings, effective_rate, predicted_iteration

SHAPE_COLUMNS = ("host_rates", "cross_traffic", "racks")


def _kinds(df: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(straggler link, cross traffic, racks) masks of rows (older rows lack the columns: flat)."""
    none = pd.Series(False, index=df.index)
    slow = df["host_rates"].notna() if "host_rates" in df else none
    cross = df["cross_traffic"].fillna(0) > 0 if "cross_traffic" in df else none
    racks = df["racks"].fillna(1) > 1 if "racks" in df else none
    return slow, cross, racks


def is_shaped(df: pd.DataFrame) -> pd.Series:
    """Rows whose trial had a per-host rate, cross traffic or racks."""
    slow, cross, racks = _kinds(df)
    return slow | cross | racks


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


# ------------------------------------------------------------------------------------------------ racks, cross traffic
RACK_COLUMNS = ["model", "batch_size", "world_size", "rate_bps", "variant", "racks", "oversubscription", "trials",
                "measured_ms", "flat_ms", "predicted_ms", "error_pct", "bounding_link"]  # fmt: skip
CROSS_COLUMNS = ["model", "batch_size", "world_size", "rate_bps", "variant", "cross_traffic", "trials",
                 "measured_ms", "flat_ms", "predicted_ms", "error_pct", "bounding_link"]  # fmt: skip
_GROUP = ["model", "batch_size", "world_size", "rate_bps"]


def combined_shapes(shaped: pd.DataFrame) -> int:
    """How many shaped rows combine two shapes (drawn nowhere: the report's note says so)."""
    if shaped.empty:
        return 0
    slow, cross, racks = _kinds(shaped)
    return int(((slow.astype(int) + cross.astype(int) + racks.astype(int)) > 1).sum())


def _flat_ms(flat: pd.DataFrame) -> dict[tuple, float]:
    """The flat trials' median iteration time (ms) per (model, batch size, world size, rate, variant)."""
    return {k: float(t) * 1e3 for k, t in flat.groupby([*_GROUP, "variant"])["t_s"].median().items()}


def _point(g: pd.DataFrame, key: tuple, flows: int, profiles: Sequence[pm.Profile], s: ModelSettings,
           flat_ms: float) -> dict:  # fmt: skip
    """One configuration's measured median, the flat median at its rate, and the prediction at the link that bounds
    its ring (beside `flows` flows: with the terms calibrated beside as many, at the trial's rate)."""
    model, bs, ws, rate, variant = key
    b = pm.ring_bottleneck(trial_shape.row_layout(g.iloc[0]))
    goodput = g["measured_goodput_bps"].median() if "measured_goodput_bps" in g else None
    link = b.link if b.bounded else "unshaped"
    bps = b.rate_bps if b.bounded and not flows else effective_rate(rate, goodput)
    predicted = math.nan
    if flows and not s.calibrated_beside(int(ws), flows):
        link += f"; not predicted: no calibration beside {flows} flows (testbed calibrate --cross-traffic {flows})"
    elif bps > 0:
        full = predicted_iteration(profiles, s, model, bs, ws, variant, g["compressor"].iloc[0], bps,
                                   g["delay_s"].median(), flows)  # fmt: skip
        predicted = full[0].iter_time_s * 1e3 if full else math.nan
        link += ", calibrated beside them" if flows and full else ""
    measured = float(g["t_s"].median()) * 1e3
    return {"model": model, "batch_size": int(bs), "world_size": int(ws), "rate_bps": rate, "variant": variant,
            "trials": len(g), "measured_ms": measured, "flat_ms": flat_ms, "predicted_ms": predicted,
            "error_pct": (predicted - measured) / measured * 100, "bounding_link": link}  # fmt: skip


def rack_points(flat: pd.DataFrame, shaped: pd.DataFrame, profiles: Sequence[pm.Profile] = (),
                s: ModelSettings | None = None) -> pd.DataFrame:  # fmt: skip
    """Per (model, batch size, world size, rate, variant, racks, oversubscription): the rack trials (no straggler
    link, no cross traffic), measured against predicted at the ring's bottleneck (the spine's share per cross-rack
    step where it is slower than a host link), beside the flat trials' median at the rate."""
    s = s or ModelSettings()
    if shaped.empty:
        return pd.DataFrame(columns=RACK_COLUMNS)
    slow, cross, racks = _kinds(shaped)
    rows = shaped[racks & ~slow & ~cross]
    flat_ms = _flat_ms(flat)
    out = []
    for key, g in rows.groupby([*_GROUP, "variant", "racks", "oversubscription"], dropna=False):
        point = _point(g, key[:5], 0, profiles, s, flat_ms.get(key[:5], math.nan))
        out.append({**point, "racks": int(key[5]), "oversubscription": key[6]})
    return pd.DataFrame(out, columns=RACK_COLUMNS)


def cross_points(flat: pd.DataFrame, shaped: pd.DataFrame, profiles: Sequence[pm.Profile] = (),
                 s: ModelSettings | None = None) -> pd.DataFrame:  # fmt: skip
    """Per (model, batch size, world size, rate, variant, flows): the cross-traffic trials (one switch, no straggler
    link) and the flat trials at the rate as 0 flows, measured against predicted (beside N flows: with the terms
    calibrated beside N; not predicted without such a calibration)."""
    s = s or ModelSettings()
    if shaped.empty:
        return pd.DataFrame(columns=CROSS_COLUMNS)
    slow, cross, racks = _kinds(shaped)
    rows = shaped[cross & ~slow & ~racks]
    if rows.empty:
        return pd.DataFrame(columns=CROSS_COLUMNS)
    base = flat.merge(rows[_GROUP].drop_duplicates(), on=_GROUP).assign(cross_traffic=0)
    flat_ms = _flat_ms(flat)
    out = []
    for key, g in pd.concat([rows, base], ignore_index=True).groupby([*_GROUP, "variant", "cross_traffic"]):
        point = _point(g, key[:5], int(key[5]), profiles, s, flat_ms.get(key[:5], math.nan))
        if not key[5] and key[3]:
            point["bounding_link"] = "every host link (flat)"
        out.append({**point, "cross_traffic": int(key[5])})
    return pd.DataFrame(out, columns=CROSS_COLUMNS)


def _shape_figures(points: pd.DataFrame, x: str, xlabel: str, stem: str, what: str, out: Path,
                   xscale: str = "linear") -> list[tuple[str, Path]]:  # fmt: skip
    """One figure per (model, batch size, world size, rate): the median iteration time against `x`, a line per
    compressor (measured: solid with markers, predicted: dashed)."""
    from matplotlib.figure import Figure

    figures = []
    points = points[points[x].notna()]
    for (model, bs, ws, rate), g in points.groupby(_GROUP):
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for variant, gc in g.groupby("variant"):
            pts = gc.sort_values(x)
            (line,) = ax.plot(pts[x], pts["measured_ms"], marker="o", label=variant)
            if pts["predicted_ms"].notna().any():
                ax.plot(pts[x], pts["predicted_ms"], linestyle="--", color=line.get_color(),
                        label=f"{variant} (predicted)")  # fmt: skip
        ax.set_xscale(xscale)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("iteration time (ms, median)")
        ax.set_title(f"{model} bs{int(bs)}, {int(ws)} ranks, host links at {fmt_rate(rate)}")
        ax.legend(fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
        path = out / f"{stem}_{model}_bs{int(bs)}_p{int(ws)}_{int(rate)}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        figures.append((f"{model} bs{int(bs)}, {int(ws)} ranks: iteration time vs {what}", path))
    return figures


def rack_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    return _shape_figures(points, "oversubscription", "oversubscription (a rack's host rates / its uplink)",
                          "racks", "the spine's oversubscription", out, xscale="log")  # fmt: skip


def cross_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    return _shape_figures(points, "cross_traffic", "bulk TCP flows of cross traffic (0: the flat trials)",
                          "cross_traffic", "flows of cross traffic", out)  # fmt: skip


def _shape_markdown(points: pd.DataFrame, title: str, x: str, x_head: str, x_text) -> str:
    lines = ["", f"## {title}", "",
             f"| workload | ranks | host links | compressor | {x_head} | trials | measured ms | flat ms | predicted ms "
             "| error | bounding link |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    def ms(v: float) -> str:
        return "" if math.isnan(v) else f"{v:.0f}"

    for r in points.sort_values([*_GROUP, "variant", x]).to_dict("records"):
        err = "" if math.isnan(r["error_pct"]) else f"{r['error_pct']:+.0f} %"
        lines.append(f"| {r['model']} bs{r['batch_size']} | {r['world_size']} | {fmt_rate(r['rate_bps'])} "
                     f"| {r['variant']} | {x_text(r)} | {r['trials']} | {r['measured_ms']:.0f} | {ms(r['flat_ms'])} "
                     f"| {ms(r['predicted_ms'])} | {err} | {r['bounding_link']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def rack_markdown(points: pd.DataFrame) -> str:
    def ratio(r: dict) -> str:
        over = r["oversubscription"]
        spine = "unshaped spine" if over is None or over != over else f"1:{over:g}"
        return f"{r['racks']} racks, {spine}"

    return _shape_markdown(points, "Racks behind a spine", "oversubscription", "racks", ratio)


def cross_markdown(points: pd.DataFrame) -> str:
    return _shape_markdown(points, "Cross traffic", "cross_traffic", "flows",
                           lambda r: "0 (flat)" if r["cross_traffic"] == 0 else str(r["cross_traffic"]))  # fmt: skip
