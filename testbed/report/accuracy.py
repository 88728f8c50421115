"""Time to accuracy: convergence runs composed with iteration times at every rate (issue 33).

Synchronous training takes the same steps at any link rate (the same seed and data order give the same updates:
tests/integration/test_time_to_accuracy.py checks it), so a sweep measures convergence once per compressor and seed
(`testbed sweep --target-accuracy A --max-steps N --eval-every K --seeds S --bw none`) and this module composes

    time to accuracy at rate r  =  steps to target  x  iteration time at r

where the iteration time is the mean measured by a throughput sweep on the same model, batch, workers and data
(rows without a target; "measured"; with several runs at a rate, e.g. `--seeds 3`, the median of their means: on
2 shared cores one launch's compute-bound steps ran 10-45 % apart from another's), else the performance model's
prediction from a profile ("predicted"). Steps to target are the mean over the seeds that reached it; a compressor
none of whose seeds reached it "never" does, at any rate. Rows with a target at a shaped rate are direct runs: their
training time to target is the check of the composition (`composition_errors`, which composes with the direct
run's own seed's steps; `composition_summary`: their median over several direct launches).

Pure pandas (no torch): the report imports it; the figure is drawn with matplotlib like the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from testbed import perfmodel as pm
from testbed.report.analysis import (
    fmt_rate,
    launch_spread_pct,
    measured_crossover,
    variant_profile,
)
from testbed.report.predicted import ModelSettings, network

KEYS = ["model", "batch_size", "world_size", "data"]  # a convergence run and the throughput runs it composes with
TTA_COLUMNS = ["model", "batch_size", "world_size", "data", "compressor", "target_accuracy", "seeds", "seeds_reached",
               "steps_to_target", "rate_bps", "bandwidth", "iter_time_s", "iter_time_spread_pct", "source", "tta_s",
               "tta_speedup", "throughput_speedup"]  # fmt: skip


def split_convergence(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(throughput rows, learning rows): a row that evaluated (--eval-every) is a learning run: to a target (a
    convergence run, or a direct run to target at a shaped rate) or for a fixed budget; the throughput analysis keeps
    the others, or every row when there are no others."""
    if "eval_every" not in ok.columns or "target_accuracy" not in ok.columns:
        return ok, ok.iloc[0:0]
    conv = ok["eval_every"].notna()
    # rows of older schemas have no data column (or an all-null float one): they trained on synthetic batches
    ok = ok.assign(data=ok["data"].astype(object).fillna("synthetic") if "data" in ok.columns else "synthetic")
    return (ok[~conv] if (~conv).any() else ok), ok[conv]


def _launch_means_s(g: pd.DataFrame) -> pd.Series:
    """Each throughput launch's mean iteration time (the row's `t_s` where the mean is missing)."""
    return g["iter_time_s_mean"].fillna(g["t_s"])


def _mean_iter_s(g: pd.DataFrame) -> float:
    return float(_launch_means_s(g).median())


def compose(thr: pd.DataFrame, conv: pd.DataFrame, profiles: Sequence[pm.Profile], s: ModelSettings,
            baseline: str) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    """One row per (group, compressor, rate): steps to target x iteration time (see the module docstring)."""
    rows, notes = [], []
    if conv.empty:
        return pd.DataFrame(columns=TTA_COLUMNS), notes
    thr = thr.assign(data=thr["data"].fillna("synthetic") if "data" in thr.columns else "synthetic")
    for key, g in conv[conv["target_accuracy"].notna()].groupby([*KEYS, "variant", "target_accuracy"]):
        *group, variant, target = key
        model, bs, ws, data = group
        unshaped = g[g["rate_bps"] == 0]
        runs = unshaped if not unshaped.empty else g
        per_seed = runs.groupby("seed")["steps_to_target"].first()
        reached = per_seed.dropna()
        steps = float(reached.mean()) if len(reached) else None
        if 0 < len(reached) < len(per_seed):
            notes.append(f"{variant} ({model} bs{bs}, {ws} workers, {data}): {len(reached)} of {len(per_seed)} seeds "
                         f"reached {target:g}; steps to target averaged over those")  # fmt: skip
        same = thr[(thr["model"] == model) & (thr["batch_size"] == bs) & (thr["world_size"] == ws)
                   & (thr["data"] == data)]  # fmt: skip
        direct = g[g["rate_bps"] > 0]
        rates = sorted({int(r) for r in same["rate_bps"]} | {int(r) for r in direct["rate_bps"]})
        prof = pm.pick_profile(profiles, model, int(bs), int(ws))
        for rate in rates:
            at = same[(same["variant"] == variant) & (same["rate_bps"] == rate)]
            source, it, spread = None, None, None
            if not at.empty:
                source, it, spread = "measured", _mean_iter_s(at), launch_spread_pct(_launch_means_s(at))
            elif prof is not None and rate > 0 and g["compressor"].iloc[0] in prof.compressor_names():
                source = "predicted"
                it = pm.predict_iteration(variant_profile(prof, variant), g["compressor"].iloc[0],
                                          network(ws, rate, 0.0, s),
                                          hook_blocks_backward=s.hook_blocks_backward).iter_time_s  # fmt: skip
            if source is None:
                continue
            rows.append({"model": model, "batch_size": int(bs), "world_size": int(ws), "data": data,
                         "compressor": variant, "target_accuracy": float(target), "seeds": len(per_seed),
                         "seeds_reached": len(reached), "steps_to_target": steps, "rate_bps": rate,
                         "bandwidth": fmt_rate(rate), "iter_time_s": it, "iter_time_spread_pct": spread,
                         "source": source,
                         "tta_s": steps * it if steps is not None else math.inf})  # fmt: skip
    tta = pd.DataFrame(rows, columns=TTA_COLUMNS[:-2])
    if tta.empty:
        notes.append("time to accuracy: convergence runs but no iteration time on the same model, batch, workers and "
                     "data (run a throughput sweep with the same --data, or `testbed profile` for predictions)")
        return pd.DataFrame(columns=TTA_COLUMNS), notes
    base = tta[tta["compressor"] == baseline][[*KEYS, "target_accuracy", "rate_bps", "tta_s", "iter_time_s"]]
    tta = tta.merge(base.rename(columns={"tta_s": "base_tta_s", "iter_time_s": "base_iter_s"}),
                    on=[*KEYS, "target_accuracy", "rate_bps"], how="left")  # fmt: skip
    tta["tta_speedup"] = tta["base_tta_s"] / tta["tta_s"]
    tta["throughput_speedup"] = tta["base_iter_s"] / tta["iter_time_s"]
    return tta[TTA_COLUMNS], notes


def crossovers(tta: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per compressor: its time-to-accuracy crossover beside its throughput crossover (the rate below which it
    wins; "always"/"never" over the rates measured), or "never reaches A" when no seed reached the target."""
    out = []
    for key, g in tta[tta["compressor"] != baseline].groupby([*KEYS, "compressor", "target_accuracy"]):
        g = g.sort_values("rate_bps")
        *group, comp, target = key
        thr_kind, thr_b = measured_crossover(g["rate_bps"].tolist(), g["throughput_speedup"].fillna(np.nan).tolist())
        if g["seeds_reached"].iloc[0] == 0:
            tta_text = f"never reaches {target:g}"
        else:
            kind, b = measured_crossover(g["rate_bps"].tolist(), g["tta_speedup"].replace(0, np.nan).tolist())
            tta_text = pm.rate_text(b) if kind == "crossover" else kind
        out.append({"model": group[0], "batch_size": group[1], "world_size": group[2], "data": group[3],
                    "compressor": comp, "target": target,
                    "time-to-accuracy crossover": tta_text,
                    "throughput crossover": pm.rate_text(thr_b) if thr_kind == "crossover" else thr_kind,
                    "estimated from": ", ".join(sorted(set(g["source"])))})  # fmt: skip
    return pd.DataFrame(out)


def headline(tta: pd.DataFrame, baseline: str) -> tuple[str, int, int, int]:
    """'On time to accuracy, compression won in n of m configurations (on throughput in k of m)'."""
    rows = tta[(tta["compressor"] != baseline) & tta["tta_speedup"].notna() & (tta["world_size"] > 1)]
    n_tta = int((rows["tta_speedup"] > 1.0).sum())
    n_thr = int((rows["throughput_speedup"] > 1.0).sum())
    text = (f"On time to accuracy compression won in {n_tta} of {len(rows)} configurations "
            f"(on throughput in {n_thr} of the same {len(rows)}).")  # fmt: skip
    return text, n_tta, n_thr, len(rows)


def final_accuracy(conv: pd.DataFrame) -> pd.DataFrame:
    """Test accuracy after a fixed budget, mean and spread over seeds: the fixed-budget runs' (no target) when the group
    has them, else the largest evaluated step every convergence run of the group reached (runs stopped at the target
    are read at that step of their curve)."""
    out = []
    for key, g in conv[conv["rate_bps"] == 0].groupby(KEYS):
        if g["target_accuracy"].isna().any():
            g = g[g["target_accuracy"].isna()]
        curves = {i: json.loads(c) for i, c in g["curve"].items() if isinstance(c, str)}
        if not curves:
            continue
        budget = min(c[-1]["step"] for c in curves.values())
        for variant, gv in g.groupby("variant"):
            accs = [max((p for p in curves[i] if p["step"] <= budget), key=lambda p: p["step"])["test_accuracy"]
                    for i in gv.index if i in curves]  # fmt: skip
            out.append({"model": key[0], "batch_size": key[1], "world_size": key[2], "data": key[3],
                        "compressor": variant, "budget_steps": budget, "seeds": len(accs),
                        "accuracy_mean": float(np.mean(accs)), "accuracy_spread": float(np.ptp(accs)),
                        "accuracy_std": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0})  # fmt: skip
    return pd.DataFrame(out)


def _same_group(df: pd.DataFrame, row: pd.Series, variant_column: str) -> pd.DataFrame:
    """The rows of `df` with `row`'s model, batch, workers, data and variant (named `variant_column` in `df`)."""
    keep = df[variant_column] == row["variant"]
    for key in KEYS:
        keep &= df[key] == row[key]
    return df[keep]


def composition_errors(tta: pd.DataFrame, conv: pd.DataFrame) -> pd.DataFrame:
    """Direct shaped runs (a target, a rate) against the composition at their rate (same group and compressor).

    A run that reached the target checks the whole claim (`checks` "time to target"): its own seed's unshaped steps
    to target x the iteration time at the rate (the rate changes the time per step, not the steps); the mean over
    seeds, which the time-to-accuracy table uses, would add the seeds' spread in steps to the error. Without an
    unshaped run of that seed, the mean is used and `steps_from` says so. A run that stopped at --max-steps checks
    the half that carries the error (`checks` "time per step"): the steps it ran x the iteration time against its
    training time, so every direct launch, reached or not, says how far one launch's time per step lies from the
    throughput runs' (`composition_summary` takes their median)."""
    out = []
    direct = conv[(conv["rate_bps"] > 0) & conv["target_accuracy"].notna() & conv["train_time_s"].notna()]
    unshaped = conv[(conv["rate_bps"] == 0) & conv["target_accuracy"].notna()]
    for _, d in direct.iterrows():
        m = _same_group(tta, d, "compressor")
        m = m[m["rate_bps"] == d["rate_bps"]]
        if m.empty:
            continue
        reached = pd.notna(d["train_time_to_target_s"])
        if reached:
            seed_runs = _same_group(unshaped, d, "variant")
            seed_runs = seed_runs[(seed_runs["seed"] == d["seed"])
                                  & (seed_runs["target_accuracy"] == d["target_accuracy"])]  # fmt: skip
            seed_runs = seed_runs["steps_to_target"].dropna()
            if not seed_runs.empty:
                steps, steps_from = float(seed_runs.iloc[0]), f"seed {int(d['seed'])}"
            else:
                steps, steps_from = m["steps_to_target"].iloc[0], f"mean over {int(m['seeds_reached'].iloc[0])} seeds"
            direct_steps, direct_s = int(d["steps_to_target"]), float(d["train_time_to_target_s"])
        else:
            steps, steps_from = float(d["steps_run"]), "steps run (target not reached)"
            direct_steps, direct_s = int(d["steps_run"]), float(d["train_time_s"])
        if steps is None or not math.isfinite(steps) or direct_s <= 0:
            continue
        composed = steps * float(m["iter_time_s"].iloc[0])
        out.append({"model": d["model"], "world_size": int(d["world_size"]), "compressor": d["variant"],
                    "bandwidth": fmt_rate(d["rate_bps"]), "seed": int(d["seed"]),
                    "checks": "time to target" if reached else "time per step",
                    "direct_steps": direct_steps, "composed_steps": steps, "steps_from": steps_from,
                    "direct_s": direct_s, "composed_s": composed, "source": m["source"].iloc[0],
                    "throughput_spread_pct": m["iter_time_spread_pct"].iloc[0],
                    "error_pct": (composed - direct_s) / direct_s * 100})  # fmt: skip
    return pd.DataFrame(out)


def composition_summary(errors: pd.DataFrame) -> pd.DataFrame:
    """Per group, compressor and rate: the direct runs' median composition error (`to_target` of them checked the
    time to target, the others the time per step: `composition_errors`), their range, and how far apart
    the launches' own time per step lay (`launch_spread_pct`: slowest over fastest direct run's training time per
    step, minus 1; `throughput_spread_pct`: the same for the throughput launches whose median the composition took).
    On shared cores one launch's compute can run 10-45 % apart from another's for its whole length, so one direct
    run measures that spread as much as the composition; the median over several launches (the bench's
    --direct-seeds) is the figure to judge it by, and the two spreads say how far one launch alone could be off."""
    if errors.empty:
        return pd.DataFrame()
    out = []
    for (model, ws, comp, bw), g in errors.groupby(["model", "world_size", "compressor", "bandwidth"], sort=False):
        per_step = g["direct_s"] / g["direct_steps"]
        out.append({"model": model, "world_size": int(ws), "compressor": comp, "bandwidth": bw, "launches": len(g),
                    "to_target": int((g["checks"] == "time to target").sum()),
                    "median_error_pct": float(g["error_pct"].median()), "min_error_pct": float(g["error_pct"].min()),
                    "max_error_pct": float(g["error_pct"].max()),
                    "launch_spread_pct": launch_spread_pct(per_step),
                    "throughput_spread_pct": g["throughput_spread_pct"].iloc[0]})  # fmt: skip
    return pd.DataFrame(out)


def plot_accuracy_vs_time(conv: pd.DataFrame, tta: pd.DataFrame, key: tuple, rate_bps: int, path: Path) -> Path | None:
    """Test accuracy against training wall-clock time at `rate_bps`, one line per compressor (seed 0's curve, its
    steps times the iteration time at that rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, bs, ws, data = key
    g = conv[(conv["model"] == model) & (conv["batch_size"] == bs) & (conv["world_size"] == ws)
             & (conv["data"] == data) & (conv["rate_bps"] == 0) & conv["target_accuracy"].notna()]  # fmt: skip
    at = tta[(tta["model"] == model) & (tta["batch_size"] == bs) & (tta["world_size"] == ws) & (tta["data"] == data)
             & (tta["rate_bps"] == rate_bps)]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = 0
    for variant, gv in g.sort_values("seed").groupby("variant"):
        it = at.loc[at["compressor"] == variant, "iter_time_s"]
        curve = gv["curve"].iloc[0]
        if it.empty or not isinstance(curve, str):
            continue
        pts = json.loads(curve)
        ax.plot([p["step"] * float(it.iloc[0]) for p in pts], [p["test_accuracy"] for p in pts], marker="o",
                label=variant)  # fmt: skip
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    target = g["target_accuracy"].iloc[0]
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    ax.set_xlabel(f"training time at {fmt_rate(rate_bps)} (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{model} bs{bs}, {ws} workers, {data}: accuracy vs wall-clock")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown_section(tta: pd.DataFrame, cx: pd.DataFrame, final: pd.DataFrame, errors: pd.DataFrame,
                     errors_summary: pd.DataFrame, head: str) -> str:  # fmt: skip
    from testbed.report.render import md_table

    parts = ["", "## Time to accuracy", "", head, "",
             "Time to accuracy at a rate = steps to target (convergence runs, mean over seeds) x iteration time at "
             "that rate (measured by a throughput sweep, else predicted by the model: column `source`).", ""]  # fmt: skip
    if not cx.empty:
        parts += ["### Crossovers: time to accuracy beside throughput", "", md_table(cx), ""]
    show = tta.assign(steps_to_target=tta["steps_to_target"].map(lambda v: "never" if v is None or v != v else f"{v:.0f}"),
                      tta_s=tta["tta_s"].map(lambda v: "never" if not math.isfinite(v) else f"{v:.1f}"))  # fmt: skip
    parts += ["### Time to accuracy per rate", "", md_table(show.drop(columns=["rate_bps"])), ""]
    if not final.empty:
        parts += ["### Accuracy after a fixed budget (mean and spread over seeds)", "", md_table(final), ""]
    if not errors.empty:
        parts += ["### Composition against direct shaped runs to target", "", md_table(errors), "",
                  "Per compressor and rate, over the direct runs (each a fresh launch; `launch_spread_pct` and "
                  "`throughput_spread_pct`: how far apart the direct and the throughput launches' own time per step "
                  "lay):", "", md_table(errors_summary), ""]  # fmt: skip
    return "\n".join(parts)


def report_section(thr: pd.DataFrame, conv: pd.DataFrame, profiles: Sequence[pm.Profile], s: ModelSettings,
                   baseline: str, out: Path) -> dict:  # fmt: skip
    """Everything the report adds for convergence runs: {"headline", "notes", "figures", "markdown", "tables"};
    empty values when the results hold no convergence run. Writes time_to_accuracy.csv and the figures."""
    mixed = []  # the throughput analysis groups by model, batch and workers only: say when data sets mix in a group
    if "data" in thr.columns:
        for (model, bs, ws), g in thr.groupby(["model", "batch_size", "world_size"]):
            kinds = sorted(set(g["data"].fillna("synthetic")))
            if len(kinds) > 1:
                mixed.append(f"{model} bs{int(bs)}, {int(ws)} workers: throughput trials on {', '.join(kinds)} pooled "
                             "in one group (their inputs differ in size); report them from separate results directories")
    empty = {"headline": "", "notes": mixed, "figures": [], "markdown": "", "tables": {}}
    if conv.empty:
        return empty
    tta, notes = compose(thr, conv, profiles, s, baseline)
    notes = mixed + notes
    cx = crossovers(tta, baseline) if not tta.empty else pd.DataFrame()
    final = final_accuracy(conv)
    errors = composition_errors(tta, conv) if not tta.empty else pd.DataFrame()
    errors_summary = composition_summary(errors)
    head = headline(tta, baseline)[0] if not tta.empty else ""
    tta.to_csv(out / "time_to_accuracy.csv", index=False)
    cx.to_csv(out / "tta_crossovers.csv", index=False)
    figures = []
    for key, g in tta.groupby(KEYS):
        shaped = sorted(r for r in g["rate_bps"].unique() if r > 0)
        rate = int(shaped[0]) if shaped else 0  # the lowest rate: where communication matters most
        stem = f"{key[0]}_bs{int(key[1])}_p{int(key[2])}_{str(key[3]).split(':')[0]}"
        p = plot_accuracy_vs_time(conv, tta, key, rate, out / f"accuracy_vs_time_{stem}.png")
        if p is not None:
            figures.append((f"{key[0]} bs{int(key[1])}, {int(key[2])} workers, {key[3]}: test accuracy vs training "
                            f"time at {fmt_rate(rate)}", p))  # fmt: skip
    return {"headline": head, "notes": notes, "figures": figures,
            "markdown": markdown_section(tta, cx, final, errors, errors_summary, head),
            "tables": {"time_to_accuracy": tta, "tta_crossovers": cx, "final_accuracy": final,
                       "tta_composition_errors": errors, "tta_composition_summary": errors_summary}}  # fmt: skip
