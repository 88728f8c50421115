"""Timelines: where one iteration went on every rank (`--timeline N`), drawn and exported for trace viewers.

A trial run with `--timeline N` keeps, per rank, `trials/<id>/timeline_rank<r>.json` (runners/timeline.py; format
in docs/results-format.md, "Timeline"). This module reads them back and

* `plot_timeline` draws one iteration: one row per rank and lane (compute, codec, wire, wait), bucket-ready ticks,
  the backward window shaded and the exposed part of communication marked in red (hatched);
* `chrome_trace` turns every kept iteration of every rank into Chrome-trace JSON (`traceEvents` of complete "X" and
  instant "i" events, ts/dur in microseconds, pid = rank, tid = lane, with process/thread names), the format Perfetto
  (ui.perfetto.dev), chrome://tracing and TensorBoard's profiler plugin open. Rank clocks are aligned with the
  offsets the ranks estimated at start (`clock_offset_s`: each rank's wall clock minus rank 0's);
* `bucket_medians` sums up every kept iteration of every rank: the medians of the iteration, of backward compute and
  of exposed communication, and per bucket when it was ready, when its collective started, how long it was on the
  wire and how much of that lay beside backward compute (what the model's `Prediction.timeline` is compared with);
* `report_timelines` picks, for each variant of a results frame, one trial with a timeline (the lowest rate it ran at)
  and its median iteration, and writes the PNG, the trace and the per-bucket medians (CSV) beside the report.

Torch-free: reads JSON, draws with matplotlib.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from testbed.errors import InputError

LANES = ("compute", "codec", "wire", "wait")
LANE_COLORS = {"compute": "#4c72b0", "codec": "#dd8452", "wire": "#55a868", "wait": "#8c8c8c"}
EXPOSED_COLOR = "#c44e52"


def trial_dir(results_dir: str | Path, trial_id: str, attempt: int | None = 1) -> Path:
    """Where an attempt's rank files are (docs/results-format.md, Layout)."""
    n = int(attempt or 1)
    return Path(results_dir) / "trials" / (trial_id if n == 1 else f"{trial_id}.{n}")


def load(directory: str | Path) -> list[dict[str, Any]]:
    """Every rank's timeline document in a trial directory, by rank. InputError when there is none."""
    paths = sorted(Path(directory).glob("timeline_rank*.json"), key=lambda p: int(p.stem.removeprefix("timeline_rank")))
    if not paths:
        raise InputError(f"{directory}: no timeline_rank<r>.json; run the trial with --timeline N (and --rerun)")
    docs = []
    for p in paths:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{p}: unreadable timeline ({e})") from None
        if doc.get("format") != "testbed-timeline" or not doc.get("iterations"):
            raise InputError(f"{p}: not a testbed timeline with iterations (format testbed-timeline)")
        docs.append(doc)
    return docs


def _start_s(doc: dict, it: dict) -> float:
    """An iteration's start on rank 0's wall clock."""
    return float(it["t0_wall_s"]) - float(doc.get("clock_offset_s") or 0.0)


def median_iteration(docs: list[dict]) -> int:
    """The kept iteration (by its number) whose slowest rank's time is the median over the kept iterations."""
    common = set.intersection(*({it["iter"] for it in d["iterations"]} for d in docs))
    if not common:
        raise InputError("the ranks' timelines share no iteration")
    slowest = {k: max(it["iter_time_s"] for d in docs for it in d["iterations"] if it["iter"] == k) for k in common}
    med = statistics.median_low(slowest.values())
    return min(k for k, v in slowest.items() if v == med)


def kept_iteration(doc: dict, k: int) -> dict:
    for it in doc["iterations"]:
        if it["iter"] == k:
            return it
    raise InputError(f"rank {doc['rank']} kept no iteration {k}; kept {[i['iter'] for i in doc['iterations']]}")


# ------------------------------------------------------------------------------------------------ Chrome trace
def chrome_trace(docs: list[dict], title: str = "") -> dict[str, Any]:
    """Chrome-trace JSON (a dict with "traceEvents") of every kept iteration of every rank, on one aligned clock."""
    starts = [_start_s(d, it) for d in docs for it in d["iterations"]]
    base = min(starts)
    events: list[dict[str, Any]] = []
    for d in docs:
        pid = int(d["rank"])
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
        for tid, lane in enumerate(LANES):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        for it in d["iterations"]:
            t0_us = (_start_s(d, it) - base) * 1e6
            events.append({"ph": "X", "name": f"iteration {it['iter']}", "cat": "iteration", "pid": pid,
                           "tid": 0, "ts": t0_us, "dur": it["iter_time_s"] * 1e6,
                           "args": {k: v for k, v in it["overlap"].items()}})  # fmt: skip
            for s in it["spans"]:
                args = {k: v for k, v in s.items() if k not in ("lane", "name", "start_s", "end_s")}
                name = s["name"] if "bucket" not in s else f"{s['name']} b{s['bucket']}"
                events.append({"ph": "X", "name": name, "cat": s["lane"], "pid": pid, "tid": LANES.index(s["lane"]),
                               "ts": t0_us + s["start_s"] * 1e6, "dur": max(0.0, s["end_s"] - s["start_s"]) * 1e6,
                               "args": args})  # fmt: skip
            for a, b in it.get("comm_exposed_spans", ()):
                events.append({"ph": "X", "name": "exposed communication", "cat": "exposed", "pid": pid,
                               "tid": LANES.index("wait"), "ts": t0_us + a * 1e6, "dur": (b - a) * 1e6})  # fmt: skip
            for p in it["points"]:
                name = p["name"] if "bucket" not in p else f"{p['name']} b{p['bucket']}"
                events.append({"ph": "i", "s": "t", "name": name, "cat": "mark", "pid": pid,
                               "tid": 0 if "bucket" not in p else LANES.index("codec"),
                               "ts": t0_us + p["t_s"] * 1e6})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title, "clock": "rank 0 wall"}}


def write_chrome_trace(docs: list[dict], path: str | Path, title: str = "") -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(docs, title)) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ figure
def plot_timeline(docs: list[dict], iteration: int, path: str | Path, title: str = "") -> Path:
    """One iteration on every rank: a row per rank and lane, times in ms from the earliest rank's start."""
    its = [(d, kept_iteration(d, iteration)) for d in docs]
    base = min(_start_s(d, it) for d, it in its)
    rows = len(docs) * len(LANES)
    fig = Figure(figsize=(11, 1.0 + 0.42 * rows))
    ax = fig.subplots()
    labels, ticks = [], []
    for r, (d, it) in enumerate(its):
        off_ms = (_start_s(d, it) - base) * 1e3
        y0 = r * (len(LANES) + 0.6)
        bw = it["backward_window_s"]
        ax.fill_between([off_ms + bw[0] * 1e3, off_ms + bw[1] * 1e3], y0 - 0.5, y0 + len(LANES) - 0.5,
                        color="#4c72b0", alpha=0.12, linewidth=0)  # fmt: skip
        for li, lane in enumerate(LANES):
            y = y0 + li
            labels.append(f"rank {d['rank']} {lane}")
            ticks.append(y)
            spans = [s for s in it["spans"] if s["lane"] == lane]
            bars = [(off_ms + s["start_s"] * 1e3, max(1e-3, (s["end_s"] - s["start_s"]) * 1e3)) for s in spans]
            faded = [s.get("critical") is False for s in spans]
            if bars:
                ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=[LANE_COLORS[lane]] * len(bars),
                               alpha=None, edgecolor="white", linewidth=0.3)  # fmt: skip
                for (x, w), f in zip(bars, faded, strict=True):
                    if f:  # codec off the critical path (a callback's decode)
                        ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors="none", edgecolor="black", hatch="..",
                                       linewidth=0)  # fmt: skip
            if lane == "wire":
                exp = [(off_ms + a * 1e3, (b - a) * 1e3) for a, b in it.get("comm_exposed_spans", ())]
                if exp:
                    ax.broken_barh(exp, (y - 0.45, 0.9), facecolors="none", edgecolor=EXPOSED_COLOR, hatch="///",
                                   linewidth=1.0)  # fmt: skip
            if lane == "codec":
                for p in it["points"]:
                    if p["name"] == "bucket ready":
                        ax.plot([off_ms + p["t_s"] * 1e3] * 2, [y - 0.45, y + 0.45], color="black", linewidth=0.8)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time from the iteration's start on the earliest rank (ms; clocks aligned to rank 0)")
    ov = [it["overlap"] for _d, it in its]

    def mean_ms(key):
        vals = [o[key] for o in ov if o.get(key) is not None]
        return f"{statistics.fmean(vals) * 1e3:.1f}" if vals else "n/a"

    ax.set_title(
        f"{title}\niteration {iteration}: communication hidden {mean_ms('comm_hidden_s')} ms, exposed "
        f"{mean_ms('comm_exposed_s')} ms; codec on the critical path {mean_ms('codec_critical_s')} ms, off it "
        f"{mean_ms('codec_hidden_s')} ms (mean over ranks)",
        fontsize=9,
    )
    handles = [Patch(color=LANE_COLORS[lane], label=lane) for lane in LANES]
    handles += [
        Patch(facecolor="#4c72b0", alpha=0.12, label="backward window"),
        Patch(facecolor="none", edgecolor=EXPOSED_COLOR, hatch="///", label="exposed communication"),
        Patch(facecolor="none", edgecolor="black", hatch="..", label="codec off the critical path"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=6, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


# ------------------------------------------------------------------------------------------------ medians
BUCKET_COLUMNS = ("bucket", "ready_ms", "wire_start_ms", "wire_ms", "beside_backward_ms", "after_backward_ms", "samples")


def _overlap_s(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """How much of the union of `spans` lies inside [lo, hi]."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged)


def bucket_medians(docs: list[dict]) -> tuple[dict[str, float | int | None], pd.DataFrame]:
    """Medians over every kept iteration of every rank (one sample each): the iteration, backward compute (its
    window) and exposed communication (None where the trial did not mark its collectives: built-in sync SGD), and per
    bucket (`BUCKET_COLUMNS`, ms from the start of backward): when it was handed to the hook, when its first
    collective was issued, its collectives' time on the wire (summed over a multi-round compressor's rounds), the
    part of that beside backward compute and the part after it, and how many samples had the bucket."""
    its = [it for d in docs for it in d["iterations"]]
    exposed = [it["overlap"].get("comm_exposed_s") for it in its]
    top: dict[str, float | int | None] = {
        "samples": len(its), "ranks": len(docs),
        "iteration_ms": statistics.median(it["iter_time_s"] for it in its) * 1e3,
        "backward_ms": statistics.median(it["backward_window_s"][1] - it["backward_window_s"][0] for it in its) * 1e3,
        "exposed_ms": statistics.median(e for e in exposed if e is not None) * 1e3
        if any(e is not None for e in exposed) else None,
    }  # fmt: skip
    per: dict[int, dict[str, list[float]]] = {}
    for it in its:
        b0, b1 = it["backward_window_s"]
        wire: dict[int, list[tuple[float, float]]] = {}
        for sp in it["spans"]:
            if sp["lane"] == "wire" and "bucket" in sp:
                wire.setdefault(int(sp["bucket"]), []).append((float(sp["start_s"]), float(sp["end_s"])))
        ready = {int(p["bucket"]): float(p["t_s"]) for p in it["points"] if p["name"] == "bucket ready"}
        for b in sorted(set(wire) | set(ready)):
            row = per.setdefault(b, {c: [] for c in BUCKET_COLUMNS[1:-1]})
            if b in ready:
                row["ready_ms"].append((ready[b] - b0) * 1e3)
            if b in wire:
                spans = wire[b]
                on_wire = sum(e - a for a, e in spans)
                beside = _overlap_s(spans, b0, b1)
                row["wire_start_ms"].append((min(a for a, _ in spans) - b0) * 1e3)
                row["wire_ms"].append(on_wire * 1e3)
                row["beside_backward_ms"].append(beside * 1e3)
                row["after_backward_ms"].append(max(0.0, on_wire - beside) * 1e3)
    rows = [{"bucket": b, **{c: statistics.median(v) if v else None for c, v in cols.items()},
             "samples": max(len(v) for v in cols.values())} for b, cols in sorted(per.items())]  # fmt: skip
    return top, pd.DataFrame(rows, columns=list(BUCKET_COLUMNS))


def describe_medians(top: dict, buckets: pd.DataFrame) -> str:
    """One line of `bucket_medians`: what the report's caption says under a timeline."""
    exposed = "n/a (collectives not marked)" if top["exposed_ms"] is None else f"{top['exposed_ms']:.0f} ms"
    text = (f"medians over {top['samples']} iterations x ranks ({top['ranks']} ranks): iteration "
            f"{top['iteration_ms']:.0f} ms, backward compute {top['backward_ms']:.0f} ms, exposed communication "
            f"{exposed}")  # fmt: skip
    wired = buckets.dropna(subset=["wire_ms"])
    if not wired.empty:
        text += "; on the wire per bucket (beside backward / after it): " + ", ".join(
            f"b{int(r.bucket)} {r.wire_ms:.0f} ms ({r.beside_backward_ms:.0f} / {r.after_backward_ms:.0f})"
            for r in wired.itertuples())  # fmt: skip
    return text


# ------------------------------------------------------------------------------------------------ for the report
def _label(row: pd.Series) -> str:
    opts = json.loads(row.get("compressor_options") or "{}") if isinstance(row.get("compressor_options"), str) else {}
    rate = int(row.get("rate_bps") or 0)
    rate_txt = "unshaped" if rate == 0 else (f"{rate / 1e9:g} Gbit/s" if rate >= 1e9 else f"{rate / 1e6:g} Mbit/s")
    extra = "".join(f" {k}={v}" for k, v in sorted(opts.items()))
    mode = " serial" if row.get("serial") else ("" if row.get("overlap", True) else " overlap off")
    return f"{row['compressor']}{extra}{mode} @ {rate_txt}, {int(row['world_size'])} ranks, {row['model']}"


def asked_trials(ok: pd.DataFrame, results_dir: str | Path | None, trial_ids: tuple[str, ...]) -> list[pd.Series]:
    """The rows of the trials `--timeline` names; InputError (before the report draws or writes anything) when the
    results directory is unknown or one is not an ok trial of it."""
    if trial_ids and results_dir is None:
        raise InputError("--timeline needs the results directory the trials are stored in")
    rows = []
    for tid in trial_ids:
        hit = ok[ok["trial_id"] == tid] if "trial_id" in ok.columns else ok.iloc[0:0]
        if hit.empty:
            raise InputError(f"--timeline {tid}: no ok trial with this id in {results_dir}; see `testbed results`")
        rows.append(hit.iloc[0])
    return rows


def report_timelines(ok: pd.DataFrame, results_dir: str | Path | None, out: Path,
                     trial_ids: tuple[str, ...] = ()) -> tuple[list[tuple[str, Path]], list[str]]:  # fmt: skip
    """(caption, png) per drawn trial and notes. Draws the trials named in `trial_ids` (InputError when one is not
    in `ok` or has no timeline) and, for each variant with timelines, its trial at the lowest rate; writes each
    one's Chrome trace as timeline_<id>.trace.json and its per-bucket medians (`bucket_medians`) as
    timeline_<id>.buckets.csv beside the PNG; the caption gives those medians."""
    if results_dir is None and not trial_ids:
        return [], []
    rows: list[pd.Series] = asked_trials(ok, results_dir, trial_ids)
    figures: list[tuple[str, Path]] = []
    notes: list[str] = []
    if "timeline_iters" in ok.columns:
        with_tl = ok[ok["timeline_iters"].fillna(0) > 0].copy()
        if not with_tl.empty:
            with_tl["_variant"] = with_tl.apply(
                lambda r: (r["compressor"], r.get("compressor_options"), bool(r.get("serial")), bool(r.get("overlap"))),
                axis=1,
            )
            for _v, g in with_tl.groupby("_variant", sort=False):
                g = g.assign(_rate=g["rate_bps"].fillna(0).replace(0, float("inf")))
                row = g.sort_values("_rate").iloc[0]
                if row["trial_id"] not in trial_ids:
                    rows.append(row)
    for row in rows:
        tid = row["trial_id"]
        directory = trial_dir(results_dir, tid, row.get("attempt"))
        try:
            docs = load(directory)
        except InputError as e:
            if tid in trial_ids:
                raise InputError(f"--timeline {tid}: {e}") from None
            notes.append(f"timeline of {tid} skipped: {e}")
            continue
        k = median_iteration(docs)
        label = _label(row)
        png = plot_timeline(docs, k, out / f"timeline_{tid}.png", title=label)
        write_chrome_trace(docs, out / f"timeline_{tid}.trace.json", title=label)
        top, buckets = bucket_medians(docs)
        buckets.round(3).to_csv(out / f"timeline_{tid}.buckets.csv", index=False)
        figures.append((f"{label}: timeline of iteration {k} (trial {tid}; Chrome trace timeline_{tid}.trace.json; "
                        f"{describe_medians(top, buckets)}, per bucket in timeline_{tid}.buckets.csv)", png))  # fmt: skip
    return figures, notes
