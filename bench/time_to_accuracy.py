"""Time to accuracy benchmark (issue 33): does the faster iteration reach the same model sooner?

Every built-in compressor on the real Fashion-MNIST (Debian's dataset-fashion-mnist), the small CNN, 2 and 4 emulated
hosts, 3 seeds, through the testbed's own CLI (the path users take):
  1. convergence: `sweep --bw none --target-accuracy A --max-steps N --eval-every E --seeds S` (steps to target);
  2. fixed budget: `sweep --bw none --max-steps B --eval-every B --seeds S` (accuracy after B steps, over seeds);
  3. throughput: `sweep --bw R1,R2,R3 --seeds T` on the same data, no evaluation (iteration time per rate: the median
     of T launches);
  4. direct: `sweep --bw R1 --target-accuracy A --seeds K` (training time to target, shaped; --direct-bw,
     --direct-seeds);
then `testbed report` composes time to accuracy per rate (steps x iteration time) and this script prints Markdown
tables: steps to target, final accuracy after the budget, time to accuracy at the three rates, the time-to-accuracy
crossover beside the throughput crossover, and the composition's error against the direct runs.

    sudo .venv/bin/python bench/time_to_accuracy.py --out /tmp/tta-bench            # full (prints its estimate)
    sudo .venv/bin/python bench/time_to_accuracy.py --quick --out /tmp/tta-smoke    # smoke: 2 hosts, 2 compressors

Needs root (namespaces). Uses its own cluster names (btta2, btta4) and takes them down at the end.
Resumable: the sweeps skip trials already stored ok in --out.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPRESSORS = "syncsgd,fp16,bf16,powersgd,acpsgd,signsgd,topk,mstopk"
# per-trial cost guesses on the 2-core VM (cnn, batch 32, 28x28): step, one evaluation of 10,000 images, start-up
STEP_S = {2: 0.05, 4: 0.12}
EVAL_S = {2: 4.0, 4: 5.0}
START_S = 12.0


def cli(*args: str, timeout_s: float = 24 * 3600) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "testbed.cli", *args]
    print("$ testbed " + " ".join(args), flush=True)
    done = subprocess.run(cmd, env=env, cwd=REPO, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise SystemExit(f"testbed {args[0]} failed (exit {done.returncode})")


def estimate_s(a: argparse.Namespace, hosts: list[int], comps: list[str], rates: list[str]) -> float:
    """A rough upper estimate: convergence and direct runs to --max-steps, evaluations, throughput runs."""
    total = 0.0
    for h in hosts:
        conv = a.seeds * len(comps) * (a.max_steps * STEP_S[h] + a.max_steps / a.eval_every * EVAL_S[h] + START_S)
        budget = a.seeds * len(comps) * (a.budget * STEP_S[h] + EVAL_S[h] + START_S)
        thr = a.throughput_seeds * len(rates) * len(comps) * ((a.iters + 5) * STEP_S[h] * 3 + START_S)  # low rates x3
        direct = a.direct_seeds * len(a.direct_bw.split(",")) * len(comps) * (a.max_steps * STEP_S[h] * 3 + a.max_steps / a.eval_every * EVAL_S[h]
                                             + START_S)  # fmt: skip
        total += conv + budget + thr + direct
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results directory (resumable)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 hosts, syncsgd and powersgd, 1 seed, tiny budgets")
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--compressors", default=COMPRESSORS)
    ap.add_argument("--bw", default="2mbit,10mbit,100mbit", help="three shaped rates for time to accuracy")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--budget", type=int, default=500, help="steps of the fixed-budget runs")
    ap.add_argument("--direct-bw", default=None, help="rates of the direct runs to target (default: the lowest of --bw)")
    ap.add_argument("--direct-seeds", type=int, default=3,
                    help="direct runs to target per compressor and rate, seeds 0..K-1, each a fresh launch checked against "
                         "its own seed's composition (the report's summary takes their median error: one launch's compute "
                         "can run 10-45 %% apart from another's on 2 shared cores)")
    ap.add_argument("--throughput-seeds", type=int, default=3,
                    help="throughput runs per compressor and rate, each a fresh launch (the report takes their median: "
                         "on 2 shared cores one launch's compute-bound steps ran 10-45 %% apart from another's)")
    ap.add_argument("--iters", type=int, default=200,
                    help="measured iterations of the throughput runs (not fewer: the bucket's head start weighs on a short "
                         "run; with schema 5's 64 KB bucket, 30 iterations' mean ran 3-10 %% fast at 2 Mbit/s)")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--estimate", action="store_true", help="print the estimate and exit")
    a = ap.parse_args()
    if a.quick:
        a.hosts, a.compressors, a.bw, a.seeds = "2", "syncsgd,powersgd", "10mbit,100mbit,1gbit", 1
        a.target, a.max_steps, a.eval_every, a.budget, a.iters, a.direct_seeds = 0.3, 100, 50, 50, 10, 1
    hosts = [int(h) for h in a.hosts.split(",")]
    comps = a.compressors.split(",")
    rates = a.bw.split(",")
    a.direct_bw = a.direct_bw or rates[0]
    est = estimate_s(a, hosts, comps, rates)
    print(f"estimate: about {est / 3600:.1f} h ({est / 60:.0f} min) on the 2-core VM for {len(hosts)} host count(s) x "
          f"{len(comps)} compressors x {a.seeds} seeds, rates {a.bw}", flush=True)  # fmt: skip
    if a.estimate:
        return 0
    t0 = time.monotonic()
    learn = ["--model", a.model, "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--data", "fashion-mnist",
             "--warmup-iters", "2", "--no-probe", "--out", a.out, "--yes", "--compressor", a.compressors]  # fmt: skip
    target = ["--target-accuracy", str(a.target), "--max-steps", str(a.max_steps), "--eval-every", str(a.eval_every)]
    for h in hosts:
        name = f"btta{h}"
        cli("up", "--name", name, "--hosts", str(h), "--recreate")
        try:
            common = ["--name", name, "--world-size", str(h), *learn]
            cli("sweep", *common, "--bw", "none", *target, "--seeds", str(a.seeds))
            cli("sweep", *common, "--bw", "none", "--max-steps", str(a.budget), "--eval-every", str(a.budget),
                "--seeds", str(a.seeds))  # fmt: skip
            cli("sweep", *common, "--bw", a.bw, "--iters", str(a.iters), "--seeds", str(a.throughput_seeds))
            cli("sweep", *common, "--bw", a.direct_bw, *target, "--seeds", str(a.direct_seeds))
        finally:
            cli("down", "--name", name)
    elapsed = time.monotonic() - t0
    print_tables(a, elapsed)
    return 0


def print_tables(a: argparse.Namespace, elapsed_s: float) -> None:
    from testbed.report import report_from_dir
    from testbed.report.render import md_table

    rep = report_from_dir(a.out, Path(a.out) / "report")
    t = rep.tables
    print(f"\n## Time to accuracy (bench/time_to_accuracy.py)\n\n`{' '.join(sys.argv)}`, "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} ({os.cpu_count()} cores), "
          f"{elapsed_s / 60:.0f} min. Fashion-MNIST, {a.model} batch {a.batch_size} per rank, lr {a.lr}, target "
          f"{a.target}, at most {a.max_steps} steps, evaluation every {a.eval_every} steps, {a.seeds} seed(s).\n")  # fmt: skip
    print(rep.headline + "\n")
    tta = t.get("time_to_accuracy")
    if tta is None or tta.empty:
        print("_no time to accuracy composed_")
        return
    steps = (tta.drop_duplicates(["world_size", "compressor"])
             [["world_size", "compressor", "seeds", "seeds_reached", "steps_to_target"]])  # fmt: skip
    print("### Steps to target (mean over the seeds that reached it)\n\n" + md_table(steps))
    print("### Accuracy after a fixed budget\n\n" + md_table(t["final_accuracy"]))
    wide = tta[tta["rate_bps"] > 0].pivot_table(index=["world_size", "compressor"], columns="bandwidth",
                                                values="tta_s", aggfunc="first").reset_index()  # fmt: skip
    print("### Time to accuracy (s) per rate (composed)\n\n" + md_table(wide))
    print("### Crossovers: time to accuracy beside throughput\n\n" + md_table(t["tta_crossovers"]))
    err = t["tta_composition_errors"]
    print("### Composition against direct shaped runs to target\n\n" + md_table(err))
    if not err.empty:
        to_target = err[err["checks"] == "time to target"]["error_pct"].abs()
        print(f"runs to target, each alone: median |error| {to_target.median():.1f} %, max {to_target.max():.1f} % "
              f"({len(to_target)} runs); every direct launch, time per step included: median |error| "
              f"{err['error_pct'].abs().median():.1f} %, max {err['error_pct'].abs().max():.1f} %\n")  # fmt: skip
        summ = t["tta_composition_summary"]
        print("### Composition per compressor: the median over the direct launches\n\n" + md_table(summ))
        worst = summ["median_error_pct"].abs()
        print(f"median over launches: |error| at most {worst.max():.1f} % (median {worst.median():.1f} %), "
              f"{int((worst <= 10).sum())} of {len(summ)} points within 10 % (issue 33 asks for <= 10 %); "
              f"the launches' own time per step lay up to {summ['launch_spread_pct'].max():.0f} % apart")  # fmt: skip
        resolved = (summ["launch_spread_pct"] <= 10) & (summ["throughput_spread_pct"].fillna(0) <= 10)
        print(f"where the direct and the throughput launches each agree within 10 %: {int((worst[resolved] <= 10).sum())} "
              f"of {int(resolved.sum())} points within 10 %")  # fmt: skip
    print("\n### Steps right after an evaluation (direct runs)\n\n" + md_table(after_evaluation(Path(a.out))))


AFTER_EVAL_STEPS = 10


def after_evaluation(out: Path):
    """Per direct run to target (shaped, evaluating every E steps): the mean of the first AFTER_EVAL_STEPS steps after
    each evaluation against the mean of the others (each step the slowest rank's), beside the throughput run's mean
    at that rate. An evaluation pauses the link for seconds: its token bucket refills (a head start of burst x 8 /
    rate, docs/shaping.md) and the caches go cold; this says which way the steps after it moved."""
    import json

    import pandas as pd

    from runners.timing import slowest_rank_steps
    from testbed.results import load_results

    rows = load_results(out)
    rows = rows[rows["status"] == "ok"]
    thr = rows[(rows["rate_bps"] > 0) & rows["target_accuracy"].isna() & rows["eval_every"].isna()]
    out_rows = []
    for _, r in rows[(rows["rate_bps"] > 0) & rows["target_accuracy"].notna()].iterrows():
        per_rank = []
        for f in sorted((out / "trials" / r["trial_id"]).glob("rank*.jsonl")):
            per_rank.append([json.loads(line)["iter_time_s"] for line in f.read_text().splitlines() if line.strip()])
        steps = slowest_rank_steps(per_rank)
        first, every = int(r["warmup_iters"]), int(r["eval_every"])
        after = [t for k, t in enumerate(steps) if (first + k) >= every and (first + k) % every < AFTER_EVAL_STEPS]
        others = [t for k, t in enumerate(steps) if (first + k) < every or (first + k) % every >= AFTER_EVAL_STEPS]
        same = thr[(thr["compressor"] == r["compressor"]) & (thr["rate_bps"] == r["rate_bps"])
                   & (thr["world_size"] == r["world_size"])]  # fmt: skip
        if not after or not others:
            continue
        a_ms, o_ms = 1e3 * sum(after) / len(after), 1e3 * sum(others) / len(others)
        out_rows.append({"world_size": int(r["world_size"]), "compressor": r["compressor"],
                         "after evaluation ms": round(a_ms, 2), "other steps ms": round(o_ms, 2),
                         "after / other": round(a_ms / o_ms, 3),
                         "throughput run ms": round(1e3 * float(same["iter_time_s_mean"].median()), 2)
                         if not same.empty else None})  # fmt: skip
    return pd.DataFrame(out_rows)


if __name__ == "__main__":
    sys.exit(main())
