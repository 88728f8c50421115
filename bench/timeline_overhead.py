"""What `--timeline N` and `--trace N` cost: the same trial plain, with --timeline (every measured iteration kept) and
with --trace, interleaved and repeated, on 2 emulated hosts.

    python bench/timeline_overhead.py                  # resnet18 64x64 bs16, syncsgd/powersgd/acpsgd, 500 Mbit
    python bench/timeline_overhead.py --models mlp --compressors acpsgd --iters 3 --repeats 1   # smoke run

Timeline target: its p50 iteration time within 2 % of the plain trial's (the marks it draws are taken in every trial;
`--timeline` adds only their conversion after each iteration's clock stopped and the clock-offset estimate at start).
`--trace K` runs K extra iterations under torch.profiler between warm-up and the measured ones: those should not
move; its own cost is stated as the extra wall time per traced iteration (whole-trial wall time minus the plain
trial's, over K; noisy: the trial's start-up varies by a few hundred ms) and the size of the trace files.

Prints a Markdown table (paste into docs/benchmarks.md). Needs root; uses its own cluster name and removes it.
Measure on a quiet machine: 2 shared cores make every figure depend on what else runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from shaping.units import parse_rate_bps
from testbed.cluster.local import LocalCluster
from testbed.config import Trial
from testbed.launch import run_trial
from testbed.results import ResultsStore

NAME = "benchtl"
OPTIONS = {"powersgd": (("rank", 4),), "acpsgd": (("rank", 4),), "topk": (("ratio", 0.01),)}


def _trace_mb(store: ResultsStore, row: dict) -> float:
    d = store.attempt_dir(row["trial_id"], row["attempt"]) if row.get("attempt") else store.trial_dir(row["trial_id"])
    return sum(p.stat().st_size for p in Path(d).glob("trace_rank*.json")) / 1e6


def in_loop_cost_us(n: int = 200_000) -> float:
    """What `--timeline` adds inside the measured loop: runners.timeline.keep_iteration, the call runners/train.py
    makes each measured iteration, timed with 40 marks and 40 intervals (microseconds per iteration)."""
    import collections
    import timeit
    import types

    from runners.timeline import keep_iteration

    stats = types.SimpleNamespace(marks=[("ready", i, 0.1 * i, False) for i in range(40)],
                                  intervals=[("encode", i, 0.1, 0.2, True) for i in range(40)], hook_end=1.0)  # fmt: skip
    kept: collections.deque = collections.deque(maxlen=10)
    marks = {"serial": False, "t0": 0.0}
    return timeit.timeit(lambda: keep_iteration(kept, 1, 0.0, 0.5, None, marks, stats), number=n) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--compressors", default="syncsgd,powersgd,acpsgd")
    ap.add_argument("--rates", default="500mbit")
    ap.add_argument("--iters", type=int, default=10, help="measured iterations (all kept with --timeline)")
    ap.add_argument("--trace", type=int, default=3, help="iterations under torch.profiler (default 3)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each variant (default 3)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=None, help="results directory (default: a temporary one)")
    args = ap.parse_args()
    print(f"--timeline inside the measured loop: {in_loop_cost_us():.2f} us per iteration (bench.timeline_overhead."
          "in_loop_cost_us)\n")  # fmt: skip
    store = ResultsStore(Path(args.out or tempfile.mkdtemp(prefix="timeline-overhead-")))
    cluster, _ = LocalCluster.up(NAME, 2, recreate=True)
    variants = {"plain": {}, "timeline": {"timeline_iters": args.iters}, "trace": {"trace_iters": args.trace}}
    try:
        print(f"### timeline and trace overhead: batch {args.batch_size}/rank, 64x64, 25 MB buckets, {args.iters} "
              f"measured iterations, --timeline {args.iters}, --trace {args.trace}, median of {args.repeats} "
              "interleaved repeats, 2 emulated hosts, gloo\n")  # fmt: skip
        print("| model | compressor | rate | plain ms/iter | --timeline ms/iter | timeline overhead | --trace ms/iter "
              "(measured) | trace cost s/traced iter | trace files MB |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for model in args.models.split(","):
            for rate in args.rates.split(","):
                for comp in args.compressors.split(","):
                    rows: dict[str, list[dict]] = {v: [] for v in variants}
                    for _ in range(args.repeats):
                        for v, extra in variants.items():
                            t = Trial(compressor=comp, rate_bps=parse_rate_bps(rate), world_size=2, model=model,
                                      image_size=64, batch_size=args.batch_size, iters=args.iters, warmup_iters=3,
                                      options=OPTIONS.get(comp, ()), cluster=NAME, **extra)  # fmt: skip
                            rows[v].append(run_trial(cluster, t, store, timeout_s=1200, probe=False))
                    bad = [r["status"] for rs in rows.values() for r in rs if r["status"] != "ok"]
                    if bad:
                        print(f"| {model} | {comp} | {rate} | {', '.join(sorted(set(bad)))} | | | | | |", flush=True)
                        continue

                    def p50(v: str, key: str = "iter_time_s_p50", rows=rows) -> float:
                        return statistics.median(r[key] for r in rows[v])

                    plain, tl, tr = p50("plain"), p50("timeline"), p50("trace")
                    cost = (p50("trace", "wall_s") - p50("plain", "wall_s")) / max(1, args.trace)
                    mb = statistics.median(_trace_mb(store, r) for r in rows["trace"])
                    print(f"| {model} | {comp} | {rate} | {plain * 1e3:.1f} | {tl * 1e3:.1f} | "
                          f"{(tl / plain - 1) * 100:+.1f} % | {tr * 1e3:.1f} | {cost:.2f} | {mb:.1f} |",
                          flush=True)  # fmt: skip
        print()
    finally:
        LocalCluster.remove(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
