"""Cluster shapes in the report (issue 36): trials with a straggler link, cross traffic or racks are kept apart from
the flat curves (a straggler trial at --bw 1gbit is not a 1 Gbit/s point), and drawn as iteration time against the
straggler's rate, per compressor, beside the flat trial at the same rate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

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


def straggler_figures(flat: pd.DataFrame, shaped: pd.DataFrame, out: Path) -> list[tuple[str, Path]]:
    """One figure per (model, batch size, world size, rate) with straggler trials: the median iteration time against
    the slowest host's rate, a line per compressor, the flat trial at the rate as its right end."""
    if shaped.empty or "min_host_rate_bps" not in shaped:
        return []
    from matplotlib.figure import Figure

    rows = shaped[shaped["host_rates"].notna() & (shaped["cross_traffic"].fillna(0) == 0)]
    figures = []
    for (model, bs, ws, rate), g in rows.groupby(["model", "batch_size", "world_size", "rate_bps"]):
        base = flat[(flat["model"] == model) & (flat["batch_size"] == bs) & (flat["world_size"] == ws)
                    & (flat["rate_bps"] == rate)]  # fmt: skip
        fig = Figure(figsize=(6, 4))
        ax = fig.add_subplot()
        for comp, gc in pd.concat([g, base.assign(min_host_rate_bps=rate)]).groupby("compressor"):
            pts = gc.groupby("min_host_rate_bps")["iter_time_s_p50"].median().sort_index()
            ax.plot(pts.index / 1e6, pts.values * 1e3, marker="o", label=comp)
        ax.set_xscale("log")
        ax.set_xlabel("straggler link rate (Mbit/s)")
        ax.set_ylabel("iteration time (ms, median)")
        ax.set_title(f"{model} bs{int(bs)}, {int(ws)} ranks, others at {rate / 1e6:g} Mbit/s")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = out / f"straggler_{model}_bs{int(bs)}_p{int(ws)}_{int(rate)}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        figures.append((f"{model} bs{int(bs)}, {int(ws)} ranks: iteration time vs the straggler's rate", path))
    return figures
