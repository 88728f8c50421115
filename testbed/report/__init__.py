"""Report: measured curves from the results store beside the performance model's prediction.

`build_report(df, out_dir, ...)` takes a results DataFrame (schema_version 1, one row per trial) and writes
PNG figures, `report.html` (figures embedded, opens without network) and `summary.md`, plus CSV tables.
`report_from_dir(results_dir, out_dir, ...)` reads the store with `testbed.results.load_results` first.

Only rows with status "ok" are plotted; the others are counted. Trials repeated with the same configuration are
pooled: the point is the median of their p50 iteration times, the error bar spans the lowest p5 to the highest p95.
`samples_per_s` is read as global throughput (all ranks together).

The package splits the work: `analysis` (checks, pooling, speedups, crossovers, prediction errors), `figures`
(matplotlib) and `render` (Markdown/HTML); this module runs them in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from testbed import perfmodel as pm
from testbed.errors import InputError
from testbed.report import render
from testbed.report.accuracy import report_section as accuracy_section
from testbed.report.accuracy import split_convergence
from testbed.report.analysis import (
    DENSE_BASELINES,
    GROUP_KEYS,
    PHASE_COLUMNS,
    REQUIRED_COLUMNS,
    SCHEMA_VERSION,
    aggregate,
    baseline_description,
    check_results,
    group_label,
    hardware_line,
    headline,
    measured_crossover,
    speedup_matrix,
    speedup_table,
)
from testbed.report.figures import plot_phases, plot_scaling, plot_time_vs_bandwidth, variant_colors
from testbed.report.predicted import ModelSettings, fit_efficiency_from_trials, prediction_errors
from testbed.report.searches import load_searches, search_notes, searches_of
from testbed.report.shapes import (
    combined_shapes,
    cross_figures,
    cross_markdown,
    cross_points,
    rack_figures,
    rack_markdown,
    rack_points,
    split_shapes,
    straggler_figures,
    straggler_markdown,
    straggler_points,
)
from testbed.report.timeline import asked_trials, report_timelines

__all__ = [
    "DENSE_BASELINES",
    "PHASE_COLUMNS",
    "REQUIRED_COLUMNS",
    "SCHEMA_VERSION",
    "ReportResult",
    "baseline_description",
    "build_report",
    "check_results",
    "load_results_dir",
    "measured_crossover",
    "report_from_dir",
]


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


def build_report(
    df: pd.DataFrame,
    out_dir: str | Path,
    *,
    baseline: str = "syncsgd",
    profiles: Sequence[pm.Profile] = (),
    latency_s: float | None = None,
    efficiency: float | str | None = None,
    hook_blocks_backward: bool = True,
    calibrations: Sequence[pm.Calibration] = (),
    results_dir: str | Path | None = None,
    timeline_trials: Sequence[str] = (),
) -> ReportResult:
    """Write figures, report.html and summary.md for a results frame. Raises InputError on unusable input.

    Latency and efficiency: given, else the calibration's for each world size (`calibrations`, picked by
    calibration.terms_for: interpolated by rate when calibrated at several), else the defaults (50 us, 1.0). `efficiency="auto"` fits it from the
    communication-bound syncsgd trials (1.0 when there are none).
    """
    desc = baseline_description(baseline)
    auto = efficiency == "auto"
    if not auto and efficiency is not None and not isinstance(efficiency, int | float):
        raise InputError(f"efficiency {efficiency!r}: expected a fraction in (0, 1] or 'auto'")
    # validates latency and efficiency before any work
    pm.Network(1, 1.0, latency_s or 0.0, 1.0 if auto or efficiency is None else efficiency)
    ok, notes, counts = check_results(df)
    ok, convergence = split_convergence(ok)  # runs to a target accuracy: the time-to-accuracy section (issue 33)
    ok, shaped = split_shapes(ok)  # stragglers, cross traffic, racks: their own figure, not points of the flat curves
    asked_trials(ok, results_dir, tuple(timeline_trials))  # a bad --timeline id: one line, before anything is drawn
    s = ModelSettings(latency_s, None if auto else efficiency, hook_blocks_backward, tuple(calibrations))
    if auto:
        fitted, used = fit_efficiency_from_trials(ok, profiles, s)
        if fitted is None:
            efficiency = 1.0
            notes.append("efficiency auto: no communication-bound syncsgd trial with a profile; used 1.0")
        else:
            efficiency = fitted
            notes.append(f"efficiency fitted from {used} syncsgd trial(s): {fitted:.3f}")
        s = ModelSettings(latency_s, efficiency, hook_blocks_backward, tuple(calibrations))
    agg = aggregate(ok)
    searches, search_skipped = load_searches(results_dir)  # `testbed crossover`'s searches: marked on the curves
    notes += search_skipped + search_notes(searches)
    sp, sp_notes = speedup_table(agg, baseline)
    notes += sp_notes
    head, wins, configs = headline(sp, baseline)
    head = f"{head} {hardware_line(ok)}"  # what ran the trials, co-location included (issue 32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    colors = variant_colors(sp["variant"])
    figures: list[tuple[str, Path]] = []
    cx_rows: list[dict] = []
    models_without_profile = set()
    for key, g in sp.groupby(GROUP_KEYS):
        model, bs, ws = key
        prof = pm.pick_profile(profiles, model, int(bs), int(ws))
        if prof is None:
            models_without_profile.add(model)
        elif prof.batch_size != int(bs):
            notes.append(f"{group_label(model, bs)}: predicted with the bs{prof.batch_size} profile")
        stem = f"{model}_bs{int(bs)}_p{int(ws)}"
        path, rows = plot_time_vs_bandwidth(g, key, baseline, colors, prof, s, out / f"time_vs_bw_{stem}.png",
                                            searches_of(searches, model, int(bs), int(ws)))  # fmt: skip
        figures.append((f"{group_label(*key)}: iteration time and speedup vs bandwidth", path))
        cx_rows += rows
        figures.append((f"{group_label(*key)}: per-phase time", plot_phases(g, key, out / f"phases_{stem}.png")))
    for (model, bs), gm in sp.groupby(["model", "batch_size"]):
        prof = pm.pick_profile(profiles, model, int(bs), 1)  # one worker alone: the scaling plot's ideal line
        p = plot_scaling(gm, (model, bs), colors, prof, s, out / f"scaling_{model}_bs{int(bs)}.png", notes)
        if p is not None:
            figures.append((f"{group_label(model, bs)}: scaling", p))
    # timelines (issue 35): each variant's trial with --timeline at its lowest rate, and the trials asked for
    tl_figures, tl_notes = report_timelines(ok, results_dir, out, tuple(timeline_trials))
    figures += tl_figures
    stragglers = straggler_points(ok, shaped, profiles, s)
    figures += straggler_figures(stragglers, out)
    racks = rack_points(ok, shaped, profiles, s)
    figures += rack_figures(racks, out)
    crosses = cross_points(ok, shaped, profiles, s)
    figures += cross_figures(crosses, out)
    if combined := combined_shapes(shaped):
        notes.append(f"{combined} trial(s) combine shapes (a straggler, racks, cross traffic): listed in the results, "
                     "drawn in none of the shape figures")  # fmt: skip
    notes += tl_notes
    if any(r["measured_bps"] for r in cx_rows) and (agg["trials"] < 2).all():
        notes.append(
            "every setting ran once: a measured crossover within the run-to-run spread cannot be told from a tie "
            "(repeat the sweep with another --seed; docs/report.md, Ties)"
        )
    for m in sorted(models_without_profile):
        notes.append(f"{m}: no profile found; measured points only (run `testbed profile --model {m}`)")
    tta = accuracy_section(ok, convergence, profiles, s, baseline, out)
    figures += tta["figures"]
    notes += tta["notes"]
    head = f"{head} {tta['headline']}".strip()
    matrix = speedup_matrix(sp, baseline)
    errors = prediction_errors(agg, profiles, s)
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
            "predicted/measured",
            "verdict",
        ],
    )
    matrix.to_csv(out / "speedups.csv", index=False)
    errors.to_csv(out / "prediction_error.csv", index=False)
    crossovers.to_csv(out / "crossovers.csv", index=False)
    status_line = f"{sum(counts.values())} trial(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    world_sizes = sorted({int(w) for w in ok["world_size"].unique()})
    terms = "; ".join(f"{w} workers: {s.terms(w).describe()}" for w in world_sizes)
    settings = (
        f"model settings (+ per-trial delay on the latency): {terms}; "
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

    sections = [tta["markdown"]] if tta["markdown"] else []
    for name, points, markdown in (("stragglers", stragglers, straggler_markdown), ("racks", racks, rack_markdown),
                                   ("cross_traffic", crosses, cross_markdown)):  # fmt: skip
        if not points.empty:
            points.to_csv(out / f"{name}.csv", index=False)
            sections.append(markdown(points))
    summary = render.Summary(head, desc, status_line, settings, notes, matrix, cx_show, err_summary, errors, figures,
                             sections)  # fmt: skip
    render.write_markdown(out / "summary.md", summary)
    render.write_html(out / "report.html", summary)
    return ReportResult(
        out,
        out / "report.html",
        out / "summary.md",
        tuple(p for _, p in figures),
        head,
        wins,
        configs,
        tuple(notes),
        {"speedups": matrix, "errors": errors, "crossovers": crossovers, "stragglers": stragglers, "racks": racks,
         "cross_traffic": crosses, **tta["tables"]},
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
    if "calibrations" not in kwargs:
        kwargs["calibrations"] = pm.find_calibrations(profiles_dir)
    return build_report(load_results_dir(results_dir), out_dir, baseline=baseline, profiles=profiles,
                        results_dir=results_dir, **kwargs)  # fmt: skip
