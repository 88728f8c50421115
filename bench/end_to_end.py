"""End-to-end benchmark: sync SGD vs compressors on shaped emulated links, gloo bus bandwidth, launch overhead.

    python bench/end_to_end.py                 # full: 2 and 4 hosts, 5 rates 20mbit..5gbit, 6 compressors
    python bench/end_to_end.py --quick         # 2 hosts, 3 rates, syncsgd/fp16/powersgd (a few minutes)

Prints Markdown tables (paste into docs/benchmarks.md). Needs root. Uses its own cluster name and removes it.
Targets: gloo all-reduce busbw >= 0.93 x the shaped rate for 64 MB tensors at 1 Gbit and below; launch overhead from
`run` to the first measured iteration <= 3 s (excluding Python imports).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shaping.plan import LinkShape
from shaping.units import format_rate, parse_rate_bps
from testbed import ranks
from testbed.cluster.local import LocalCluster
from testbed.config import Trial
from testbed.launch import make_plan, run_trial
from testbed.results import ResultsStore

NAME = "bench"
BENCH_DIR = Path(__file__).resolve().parent


def busbw(cluster: LocalCluster, world_size: int, rate_bps: int, size_bytes: int, reps: int) -> dict:
    cluster.apply_shaping(LinkShape(rate_bps), cluster.hosts())
    logs = Path(tempfile.mkdtemp(prefix="busbw-"))
    # the placement and allowlisted environment a gloo trial's ranks get (not this shell's environment)
    trial = Trial("syncsgd", rate_bps, world_size, backend="gloo", ranks_per_host=1, cluster=cluster.name)
    plan = make_plan(cluster, trial, logs, timeout_s=600)
    starts = [ranks.Rank(r.host, [sys.executable, str(BENCH_DIR / "allreduce_rank.py"), "--bytes", str(size_bytes),
                                  "--reps", str(reps)], r.env, logs / f"r{r.rank}.log") for r in plan.ranks]  # fmt: skip
    with ranks.running(cluster, starts) as procs:
        watched = ranks.watch(procs, deadline=time.monotonic() + 600)
    if not watched.ok:
        raise RuntimeError(f"all-reduce ranks ended with {list(watched.codes)} (logs in {logs})")
    line = [x for x in (logs / "r0.log").read_text().splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="results directory (default: a temporary one)")
    args = ap.parse_args()
    if args.quick:
        sizes, rates = [2], ["50mbit", "200mbit", "1gbit"]
        comps = ["syncsgd", "fp16", "powersgd"]
        bus_rates = ["100mbit", "1gbit"]
    else:
        sizes, rates = [2, 4], ["20mbit", "100mbit", "500mbit", "1gbit", "5gbit"]
        comps = ["syncsgd", "fp16", "powersgd", "acpsgd", "signsgd", "topk"]
        bus_rates = ["20mbit", "100mbit", "500mbit", "1gbit", "5gbit"]
    out = Path(args.out or tempfile.mkdtemp(prefix="e2e-"))
    store = ResultsStore(out)
    opts = {"powersgd": (("rank", 4),), "acpsgd": (("rank", 4),), "topk": (("ratio", 0.01),)}
    cluster, _ = LocalCluster.up(NAME, max(sizes), recreate=True)
    try:
        print(f"## End-to-end ({'quick' if args.quick else 'full'}; ResNet-18 64x64, batch 16/rank, one bucket)\n")
        for ws in sizes:
            print(f"### {ws} emulated hosts\n")
            print("| rate | " + " | ".join(f"{c} ms/iter" for c in comps) + " | " +
                  " | ".join(f"{c} speedup" for c in comps if c != "syncsgd") + " |")
            print("|---" * (2 * len(comps)) + "|")
            for rate in rates:
                times = {}
                for comp in comps:
                    t = Trial(compressor=comp, rate_bps=parse_rate_bps(rate), world_size=ws, model="resnet18",
                              image_size=64, batch_size=16, iters=5, warmup_iters=3, bucket_cap_mb=100.0,
                              options=opts.get(comp, ()), cluster=NAME)
                    row = run_trial(cluster, t, store, timeout_s=900)
                    times[comp] = row["iter_time_s_mean"] if row["status"] == "ok" else float("nan")
                base = times["syncsgd"]
                print(f"| {rate} | " + " | ".join(f"{times[c] * 1e3:.0f}" for c in comps) + " | " +
                      " | ".join(f"{base / times[c]:.2f}x" for c in comps if c != "syncsgd") + " |", flush=True)
            print()
        print("### gloo all-reduce bus bandwidth, 64 MB fp32, 2 hosts\n")
        print("| shaped rate | busbw | busbw / rate | target |")
        print("|---|---|---|---|")
        for rate in bus_rates:
            r = busbw(cluster, 2, parse_rate_bps(rate), 64 * 2**20, 3)
            ratio = r["busbw_bps"] / parse_rate_bps(rate)
            target = ">= 0.93" if parse_rate_bps(rate) <= 1e9 else "-"
            ok = "PASS" if ratio >= 0.93 else "MISS"
            print(f"| {rate} | {format_rate(r['busbw_bps'])} | {ratio:.3f} | {target} {ok if target != '-' else ''} |",
                  flush=True)
        print()
        # launch overhead: trial wall time minus probe, measured iterations and warm-up, with a tiny model
        t = Trial(compressor="syncsgd", rate_bps=None, world_size=2, model="mlp", batch_size=8, iters=3,
                  warmup_iters=1, cluster=NAME)
        t0 = time.monotonic()
        row = run_trial(cluster, t, store, timeout_s=120, probe=False)
        wall = time.monotonic() - t0
        compute = (row["iters"] + row["warmup_iters"]) * row["iter_time_s_mean"]
        t1 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch.distributed, torchvision, psutil"], check=True)
        imports = time.monotonic() - t1
        overhead = wall - compute - imports
        print("### Launch overhead (2 hosts, mlp, unshaped, no probe)\n")
        print("| trial wall | training iterations | Python imports (one rank, measured apart) | overhead without imports | target |")
        print("|---|---|---|---|---|")
        print(f"| {wall:.2f} s | {compute:.2f} s | {imports:.2f} s | {overhead:.2f} s | <= 3 s "
              f"{'PASS' if overhead <= 3 else 'MISS'} |")
    finally:
        LocalCluster.remove(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
