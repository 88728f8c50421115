"""Overlap benchmark: every compressor with its communication overlapping backward (`--overlap on`) and blocking
inside the hook (`--overlap off`), end to end on 2 emulated hosts, plus ACP-SGD vs PowerSGD.

    python bench/overlap.py                          # resnet18 and resnet50, 10/50/500 Mbit, 25 MB buckets
    python bench/overlap.py --quick                  # resnet18, 50 and 500 Mbit, powersgd/acpsgd/topk/fp16
    python bench/overlap.py --models resnet18 --rates 50mbit --compressors powersgd,acpsgd

Prints Markdown tables (paste into docs/benchmarks.md). Needs root; uses its own cluster name and removes it.
Measure on a quiet machine: 2 shared cores make every figure depend on what else runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from shaping.units import parse_rate_bps
from testbed.cluster.local import LocalCluster
from testbed.config import Trial
from testbed.launch import run_trial
from testbed.results import ResultsStore

NAME = "benchov"
OPTIONS = {"powersgd": (("rank", 4),), "acpsgd": (("rank", 4),), "topk": (("ratio", 0.01),),
           "mstopk": (("ratio", 0.01),)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None)
    ap.add_argument("--rates", default=None)
    ap.add_argument("--compressors", default=None)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--out", default=None, help="results directory (default: a temporary one)")
    args = ap.parse_args()
    if args.quick:
        models, rates, comps = ["resnet18"], ["50mbit", "500mbit"], ["fp16", "powersgd", "acpsgd", "topk"]
    else:
        models, rates = ["resnet18", "resnet50"], ["10mbit", "50mbit", "500mbit"]
        comps = ["fp16", "bf16", "powersgd", "acpsgd", "signsgd", "topk", "mstopk"]
    models = args.models.split(",") if args.models else models
    rates = args.rates.split(",") if args.rates else rates
    comps = args.compressors.split(",") if args.compressors else comps
    store = ResultsStore(Path(args.out or tempfile.mkdtemp(prefix="overlap-")))
    cluster, _ = LocalCluster.up(NAME, 2, recreate=True)
    try:
        for model in models:
            print(f"### {model} 64x64, batch 16/rank, 25 MB buckets, 2 emulated hosts, gloo\n")
            print("| rate | compressor | overlap on ms/iter | overlap off ms/iter | off / on | comm_s on | comm_s off |")
            print("|---|---|---|---|---|---|---|")
            for rate in rates:
                for comp in comps:
                    rows = {}
                    for overlap in (True, False):
                        t = Trial(compressor=comp, rate_bps=parse_rate_bps(rate), world_size=2, model=model,
                                  image_size=64, batch_size=16, iters=args.iters, warmup_iters=3, bucket_cap_mb=25.0,
                                  options=OPTIONS.get(comp, ()), overlap=overlap, cluster=NAME)  # fmt: skip
                        rows[overlap] = run_trial(cluster, t, store, timeout_s=1200, probe=False)
                    on, off = rows[True], rows[False]
                    if on["status"] != "ok" or off["status"] != "ok":
                        print(f"| {rate} | {comp} | {on['status']} | {off['status']} | - | - | - |", flush=True)
                        continue
                    print(f"| {rate} | {comp} | {on['iter_time_s_p50'] * 1e3:.0f} | {off['iter_time_s_p50'] * 1e3:.0f} "
                          f"| {off['iter_time_s_p50'] / on['iter_time_s_p50']:.2f} | {on['comm_s'] * 1e3:.0f} | "
                          f"{off['comm_s'] * 1e3:.0f} |", flush=True)  # fmt: skip
            print()
    finally:
        LocalCluster.remove(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
