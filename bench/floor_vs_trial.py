"""A compressor's in-place floor against its trials, alternated on one machine: what `testbed profile --colocated N`
measures as a step (`lockstep_step_s`, the slowest rank's, median over steps) beside what `testbed run --bw none`
reports (`iter_time_s_p50`), repeated so that the machine's drift lands on both.

    sudo .venv/bin/python bench/floor_vs_trial.py                      # resnet18 bs16, 3 hosts, syncsgd,fp16, 5 times
    sudo .venv/bin/python bench/floor_vs_trial.py --hosts 4 --batch-size 8 --compressors acpsgd --warm
    sudo .venv/bin/python bench/floor_vs_trial.py --namespaced --repeats 6   # also each floor on the cluster's veths

Each repetition: one co-located profile of every compressor (`testbed.modelling.measure_lockstep`: the compute and
each compressor in processes of their own, as a trial's fresh ranks run; `--warm`: one launch, the compressors after
the compute, as before 943e3ff), then one unshaped trial of each on an emulated cluster of --hosts hosts (its own
name, taken down at the end). Prints a Markdown table per compressor: the floor and the trial per repetition, the
trial minus the floor, and their medians (docs/benchmarks.md, "What changes for seed 5" and seed 5's section). A floor
should sit at or under its trials. `--namespaced`: each floor also measured with its ranks on the cluster's hosts
(`measure_lockstep(on=...)`), which goes first alternating, and a second table of the two. Needs root. Measure on a
quiet machine: 2 shared cores make every figure depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "fvt"  # this bench's cluster
SUBNET = "10.79.0.0/24"


def testbed(*argv: str, timeout_s: float = 1800) -> str:
    done = subprocess.run([sys.executable, "-m", "testbed.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"floor_vs_trial: testbed {' '.join(argv[:2])} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hosts", type=int, default=3, help="ranks, one a host, all on this machine")
    ap.add_argument("--compressors", default="syncsgd,fp16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="in-place steps a launch and measured steps a trial")
    ap.add_argument("--warmup-iters", type=int, default=21, help="a trial's warm-up (the held-out sittings' 21-30)")
    ap.add_argument("--warm", action="store_true", help="measure the floors after the compute, in one launch")
    ap.add_argument("--namespaced", action="store_true", help="also measure each floor with rank r on the cluster's "
                    "host r (its namespace, gloo over its veth and the switch, as a trial's ranks), alternated with "
                    "the loopback one")  # fmt: skip
    args = ap.parse_args()
    if args.batch_size < 1 or args.hosts < 2 or args.repeats < 1 or args.iters < 1 or args.warmup_iters < 0:
        print("floor_vs_trial: error: --batch-size, --repeats and --iters must be >= 1, --hosts >= 2, "
              "--warmup-iters >= 0", file=sys.stderr)  # fmt: skip
        return 2
    from testbed.cluster.backends import open_cluster
    from testbed.cluster.base import shared_cpu_threads
    from testbed.modelling import measure_lockstep

    names = [n for n in args.compressors.split(",") if n]
    threads = shared_cpu_threads(args.hosts)  # what each rank of a local trial gets
    floors: dict[str, list[float]] = {n: [] for n in names}
    trials: dict[str, list[float]] = {n: [] for n in names}
    in_ns: dict[str, list[float]] = {n: [] for n in names}  # --namespaced
    testbed("up", "--name", NAME, "--hosts", str(args.hosts), "--subnet", SUBNET, "--recreate")
    try:
        cluster = open_cluster(NAME)
        hosts = cluster.hosts()[: args.hosts]
        with tempfile.TemporaryDirectory(prefix="fvt-") as out:
            for rep in range(args.repeats):
                where = [None, (cluster, hosts)] if args.namespaced else [None]
                for on in where if rep % 2 == 0 else where[::-1]:  # which goes first alternates
                    got = measure_lockstep(args.hosts, args.model, args.batch_size, names, None, image_size=None,
                                           seq_len=None, iters=args.iters, bucket_cap_mb=25, threads=threads,
                                           device="cpu", fresh=not args.warm, on=on)  # fmt: skip
                    for n in names:
                        (floors if on is None else in_ns)[n].append(got["codecs"][n]["step_s"] * 1e3)
                for n in names:
                    row = json.loads(testbed("run", "--name", NAME, "--bw", "none", "--compressor", n, "--model",
                                             args.model, "--batch-size", str(args.batch_size), "--iters",
                                             str(args.iters), "--warmup-iters", str(args.warmup_iters),
                                             "--bucket-cap-mb", "25", "--no-probe", "--seed", str(1000 + rep),
                                             "--out", out, "--json"))["row"]  # fmt: skip
                    trials[n].append(row["iter_time_s_p50"] * 1e3)
                    also = f", in the namespaces {in_ns[n][-1]:.0f} ms" if args.namespaced else ""
                    print(f"repetition {rep + 1}, {n}: floor {floors[n][-1]:.0f} ms{also}, trial {trials[n][-1]:.0f} "
                          "ms", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        subprocess.run([sys.executable, "-m", "testbed.cli", "down", "--name", NAME], cwd=REPO,
                       capture_output=True, timeout=300)  # fmt: skip
    how = "after the compute, one launch" if args.warm else "each in processes of its own"
    print(f"{args.model} bs{args.batch_size}, {args.hosts} hosts, floors {how}, {args.iters} steps; trials unshaped, "
          f"{args.warmup_iters} warm-up steps (ms)\n")  # fmt: skip
    print("| compressor | floors | trials | trial - floor | median floor | median trial |")
    print("|---|---|---|---|---|---|")
    for n in names:
        print(f"| {n} | {ms(floors[n])} | {ms(trials[n])} | {ms(diff(floors[n], trials[n]), '+')} | "
              f"{statistics.median(floors[n]):.0f} | {statistics.median(trials[n]):.0f} |")  # fmt: skip
    if args.namespaced:
        print("\nThe same floors with the ranks in the cluster's namespaces (gloo over the veths and the switch):\n")
        print("| compressor | on loopback | in the namespaces | namespaces - loopback | median loopback | median "
              "namespaces |\n|---|---|---|---|---|---|")  # fmt: skip
        for n in names:
            print(f"| {n} | {ms(floors[n])} | {ms(in_ns[n])} | {ms(diff(floors[n], in_ns[n]), '+')} | "
                  f"{statistics.median(floors[n]):.0f} | {statistics.median(in_ns[n]):.0f} |")  # fmt: skip
    return 0


def ms(values: list[float], sign: str = "") -> str:
    return ", ".join(f"{x:{sign}.0f}" for x in values)


def diff(first: list[float], then: list[float]) -> list[float]:
    return [b - a for a, b in zip(first, then, strict=True)]


if __name__ == "__main__":
    sys.exit(main())
