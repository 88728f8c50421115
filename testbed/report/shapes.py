"""Cluster shapes in the report (issue 36): trials with a straggler link, cross traffic or racks are kept apart from
the flat curves (a straggler trial at --bw 1gbit is not a 1 Gbit/s point), and drawn per compressor, measured and
predicted, with the link that bounded the ring (perfmodel.ring_bottleneck: the slowest host link, the spine's share
per cross-rack ring step, a link's share beside cross-traffic flows):

- straggler trials against the straggler's rate, the flat trials at the same rate as the right end;
- rack trials against the oversubscription (a rack's host rates over its uplink);
- cross-traffic trials against the number of flows, the flat trials at the same rate as 0 flows.

Each shaped point has two predictions:
- the model's ("model ms"): the profile composed at the bottleneck's rate (compute unchanged), with the terms
  calibrated at that rate; it needs a profile;
- from the flat trials at the same rate ("from flat ms", perfmodel.from_flat_trials_s): their median plus what the
  collective at the bottleneck takes beyond their measured time on the wire. It needs no profile, and is the
  prediction bench/topologies.py scores (docs/benchmarks.md): it starts from compute measured in the same setting,
  where a profile's compute can be off by more than a shape's effect with ranks sharing cores.
Beside cross traffic both use the terms of a calibration measured beside as many flows (`testbed calibrate
--cross-traffic N`: what the flows leave a collective of each size, their standing queue included); without one the
point is not predicted and its bounding-link cell names that command. A trial that combines shapes (a straggler
beside cross traffic, racks with either) is counted in a note, not drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from runners import catalog
from testbed import perfmodel as pm
from testbed import trial_shape
from testbed.report.analysis import fmt_rate
from testbed.report.predicted import ModelSettings, effective_rate, network, predicted_iteration

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


_GROUP = ["model", "batch_size", "world_size", "rate_bps"]
_MEASURED_PREDICTED = ["trials", "measured_ms", "flat_ms", "predicted_ms", "error_pct", "from_flat_ms",
                       "from_flat_error_pct", "bounding_link"]  # fmt: skip
STRAGGLER_COLUMNS = [*_GROUP, "variant", "straggler_bps", *_MEASURED_PREDICTED]
RACK_COLUMNS = [*_GROUP, "variant", "racks", "oversubscription", *_MEASURED_PREDICTED]
CROSS_COLUMNS = [*_GROUP, "variant", "cross_traffic", *_MEASURED_PREDICTED]
FLAT_LINK = "every host link (flat)"


def straggler_points(flat: pd.DataFrame, shaped: pd.DataFrame, profiles: Sequence[pm.Profile] = (),
                     s: ModelSettings | None = None) -> pd.DataFrame:  # fmt: skip
    """Per (model, batch size, world size, rate, variant, straggler rate): the median measured iteration time over the
    trials with a straggler link (no cross traffic, no racks) and the flat trials at the rate (straggler_bps = the
    rate: the base, predicted by the model alone), predicted at the ring's bottleneck (`_point`)."""
    s = s or ModelSettings()
    if shaped.empty or "min_host_rate_bps" not in shaped:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    slow, cross, racks = _kinds(shaped)
    rows = shaped[slow & ~cross & ~racks]
    base = flat.merge(rows[_GROUP].drop_duplicates(), on=_GROUP).assign(min_host_rate_bps=lambda d: d["rate_bps"],
                                                                         host_rates=None)  # fmt: skip
    flat_base = _flat_base(flat)
    out = []
    for key, g in pd.concat([rows, base], ignore_index=True).groupby([*_GROUP, "variant", "min_host_rate_bps"]):
        is_base = g["host_rates"].isna().all()
        point = _point(g, key[:5], 0, profiles, s, None if is_base else flat_base)
        if is_base:
            point["bounding_link"] = FLAT_LINK
        out.append({**point, "straggler_bps": key[5]})
    return pd.DataFrame(out, columns=STRAGGLER_COLUMNS)


# ------------------------------------------------------------------------------------------------ racks, cross traffic


def combined_shapes(shaped: pd.DataFrame) -> int:
    """How many shaped rows combine two shapes (drawn nowhere: the report's note says so)."""
    if shaped.empty:
        return 0
    slow, cross, racks = _kinds(shaped)
    return int(((slow.astype(int) + cross.astype(int) + racks.astype(int)) > 1).sum())


FlatBase = dict[tuple, tuple[float, float | None]]


def _flat_base(flat: pd.DataFrame) -> FlatBase:
    """Per (model, batch size, world size, rate, variant): the flat trials' median iteration time and median time on
    the wire (s; None where the rows lack it: sync SGD's built-in all-reduce has no hook marks)."""
    if flat.empty:
        return {}
    wire = flat["comm_wire_s"] if "comm_wire_s" in flat else pd.Series(math.nan, index=flat.index)
    g = flat.assign(_wire=wire).groupby([*_GROUP, "variant"])
    t, w = g["t_s"].median(), g["_wire"].median()
    return {k: (float(t[k]), None if math.isnan(w[k]) else float(w[k])) for k in t.index}


def _collective(profiles: Sequence[pm.Profile], key: tuple, compressor: str) -> tuple[str, int] | None:
    """The compressor's collective and its rounds: from the profile of the configuration where one has it (a
    plugin's too), else from the catalogue; None for a compressor neither knows."""
    model, bs, ws = key[:3]
    prof = pm.pick_profile(profiles, model, int(bs), int(ws))
    if prof is not None and compressor in prof.compressor_names():
        c = prof.compressor(compressor)
    elif compressor in catalog.COMPRESSORS:
        c = catalog.COMPRESSORS[compressor]
    else:
        return None
    return c.collective, c.rounds


def _from_flat_s(g: pd.DataFrame, key: tuple, bps: float, flows: int, profiles: Sequence[pm.Profile],
                 s: ModelSettings, flat_base: FlatBase) -> float:  # fmt: skip
    """The trial predicted from the flat trials at its rate (perfmodel.from_flat_trials_s): their median plus what
    its collective at `bps` (beside `flows` flows: with the terms calibrated beside as many) takes beyond their time
    on the wire. Needs no profile; NaN without flat trials, the row's payload, or a compressor the report knows."""
    rate, ws = key[3], key[2]
    collective = _collective(profiles, key, g["compressor"].iloc[0])
    payload = float(g["payload_bytes_per_iter"].median()) if "payload_bytes_per_iter" in g else math.nan
    if key not in flat_base or not rate or collective is None or math.isnan(payload):
        return math.nan
    delay = g["delay_s"].median()

    def coll_s(net: pm.Network) -> float:  # the flat trials carry the compute beside it already
        return pm.collective_time_s(collective[0], payload, collective[1], net, beside_compute_s=0.0)

    t_flat, wire = flat_base[key]
    return pm.from_flat_trials_s(t_flat, wire, coll_s(network(ws, bps, delay, s, flows)),
                                 coll_s(network(ws, rate, delay, s)))  # fmt: skip


def _point(g: pd.DataFrame, key: tuple, flows: int, profiles: Sequence[pm.Profile], s: ModelSettings,
           flat_base: FlatBase | None) -> dict:  # fmt: skip
    """One configuration's measured median, the flat median at its rate, and two predictions at the link that bounds
    its ring (beside `flows` flows: with the terms calibrated beside as many, at the trial's rate): the model's
    (`predicted_iteration`: the profile composed at that rate) and the one from the flat trials measured at the rate
    (`_from_flat_s`; not for the flat trials themselves: `flat_base` None)."""
    model, bs, ws, rate, variant = key
    b = pm.ring_bottleneck(trial_shape.row_layout(g.iloc[0]))
    goodput = g["measured_goodput_bps"].median() if "measured_goodput_bps" in g else None
    link = b.link if b.bounded else "unshaped"
    bps = b.rate_bps if b.bounded and not flows else effective_rate(rate, goodput)
    predicted = from_flat = math.nan
    if flows and not s.calibrated_beside(int(ws), flows):
        link += f"; not predicted: no calibration beside {flows} flows (testbed calibrate --cross-traffic {flows})"
    elif bps > 0:
        full = predicted_iteration(profiles, s, model, bs, ws, variant, g["compressor"].iloc[0], bps,
                                   g["delay_s"].median(), flows)  # fmt: skip
        predicted = full[0].iter_time_s * 1e3 if full else math.nan
        if flat_base is not None:
            from_flat = _from_flat_s(g, key, bps, flows, profiles, s, flat_base) * 1e3
        link += ", calibrated beside them" if flows else ""
    measured = float(g["t_s"].median()) * 1e3
    if flat_base is None:  # the flat trials themselves: their median is the flat one
        flat_ms = measured
    else:
        flat_ms = flat_base[key][0] * 1e3 if key in flat_base else math.nan
    return {"model": model, "batch_size": int(bs), "world_size": int(ws), "rate_bps": rate, "variant": variant,
            "trials": len(g), "measured_ms": measured, "flat_ms": flat_ms,
            "predicted_ms": predicted, "error_pct": (predicted - measured) / measured * 100,
            "from_flat_ms": from_flat, "from_flat_error_pct": (from_flat - measured) / measured * 100,
            "bounding_link": link}  # fmt: skip


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
    flat_base = _flat_base(flat)
    out = []
    for key, g in rows.groupby([*_GROUP, "variant", "racks", "oversubscription"], dropna=False):
        point = _point(g, key[:5], 0, profiles, s, flat_base)
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
    flat_base = _flat_base(flat)
    out = []
    for key, g in pd.concat([rows, base], ignore_index=True).groupby([*_GROUP, "variant", "cross_traffic"]):
        point = _point(g, key[:5], int(key[5]), profiles, s, flat_base if key[5] else None)
        if not key[5] and key[3]:
            point["bounding_link"] = FLAT_LINK
        out.append({**point, "cross_traffic": int(key[5])})
    return pd.DataFrame(out, columns=CROSS_COLUMNS)


def _shape_figures(points: pd.DataFrame, x: str, xlabel: str, stem: str, what: str, out: Path,
                   xscale: str = "linear") -> list[tuple[str, Path]]:  # fmt: skip
    """One figure per (model, batch size, world size, rate): the median iteration time against `x`, a line per
    compressor (measured: solid with markers; predicted by the model: dashed; from the flat trials: dotted)."""
    from matplotlib.figure import Figure

    figures = []
    points = points[points[x].notna()]
    for (model, bs, ws, rate), g in points.groupby(_GROUP):
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for variant, gc in g.groupby("variant"):
            pts = gc.sort_values(x)
            (line,) = ax.plot(pts[x], pts["measured_ms"], marker="o", label=variant)
            for column, style, what in (("predicted_ms", "--", "model"), ("from_flat_ms", ":", "from flat trials")):
                if pts[column].notna().any():
                    ax.plot(pts[x], pts[column], linestyle=style, color=line.get_color(),
                            label=f"{variant} (predicted: {what})")  # fmt: skip
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


def straggler_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    return _shape_figures(points.assign(straggler_mbps=points["straggler_bps"] / 1e6), "straggler_mbps",
                          "straggler link rate (Mbit/s; the right end: the flat trials)", "straggler",
                          "the straggler's rate", out, xscale="log")  # fmt: skip


def rack_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    return _shape_figures(points, "oversubscription", "oversubscription (a rack's host rates / its uplink)",
                          "racks", "the spine's oversubscription", out, xscale="log")  # fmt: skip


def cross_figures(points: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    return _shape_figures(points, "cross_traffic", "bulk TCP flows of cross traffic (0: the flat trials)",
                          "cross_traffic", "flows of cross traffic", out)  # fmt: skip


def _shape_markdown(points: pd.DataFrame, title: str, x: str, x_head: str, x_text) -> str:
    lines = ["", f"## {title}", "",
             f"| workload | ranks | host links | compressor | {x_head} | trials | measured ms | flat ms | model ms "
             "| error | from flat ms | error | bounding link |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def ms(v: float) -> str:
        return "" if math.isnan(v) else f"{v:.0f}"

    def pct(v: float) -> str:
        return "" if math.isnan(v) else f"{v:+.0f} %"

    for r in points.sort_values([*_GROUP, "variant", x]).to_dict("records"):
        lines.append(f"| {r['model']} bs{r['batch_size']} | {r['world_size']} | {fmt_rate(r['rate_bps'])} "
                     f"| {r['variant']} | {x_text(r)} | {r['trials']} | {r['measured_ms']:.0f} | {ms(r['flat_ms'])} "
                     f"| {ms(r['predicted_ms'])} | {pct(r['error_pct'])} | {ms(r['from_flat_ms'])} "
                     f"| {pct(r['from_flat_error_pct'])} | {r['bounding_link']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def straggler_markdown(points: pd.DataFrame) -> str:
    def straggler(r: dict) -> str:
        return fmt_rate(r["straggler_bps"]) + (" (flat)" if r["straggler_bps"] == r["rate_bps"] else "")

    return _shape_markdown(points, "Straggler links", "straggler_bps", "straggler", straggler)


def rack_markdown(points: pd.DataFrame) -> str:
    def ratio(r: dict) -> str:
        over = r["oversubscription"]
        spine = "unshaped spine" if over is None or over != over else f"1:{over:g}"
        return f"{r['racks']} racks, {spine}"

    return _shape_markdown(points, "Racks behind a spine", "oversubscription", "racks", ratio)


def cross_markdown(points: pd.DataFrame) -> str:
    return _shape_markdown(points, "Cross traffic", "cross_traffic", "flows",
                           lambda r: "0 (flat)" if r["cross_traffic"] == 0 else str(r["cross_traffic"]))  # fmt: skip
