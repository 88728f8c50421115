"""A compressor's in-place floor against its trials, alternated on one machine: what `testbed profile --colocated N`
measures as a step (`lockstep_step_s`, the slowest rank's, median over steps) beside what `testbed run --bw none`
reports (`iter_time_s_p50`), repeated so that the machine's drift lands on both.

    sudo .venv/bin/python bench/floor_vs_trial.py                      # resnet18 bs16, 3 hosts, syncsgd,fp16, 5 times
    sudo .venv/bin/python bench/floor_vs_trial.py --hosts 4 --batch-size 8 --compressors acpsgd --warm

Each repetition: one co-located profile of every compressor (`testbed.modelling.measure_lockstep`: the compute and
each compressor in processes of their own, as a trial's fresh ranks run; `--warm`: one launch, the compressors after
the compute, as before 943e3ff), then one unshaped trial of each on an emulated cluster of --hosts hosts (its own
name, taken down at the end). Prints a Markdown table per compressor: the floor and the trial per repetition, the
trial minus the floor, and their medians (docs/benchmarks.md, "What changes for seed 5" and seed 5's section). A floor
should sit at or under its trials. Needs root. Measure on a quiet machine: 2 shared cores make every figure depend on
what else runs.
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
    args = ap.parse_args()
    if args.batch_size < 1 or args.hosts < 2 or args.repeats < 1 or args.iters < 1 or args.warmup_iters < 0:
        print("floor_vs_trial: error: --batch-size, --repeats and --iters must be >= 1, --hosts >= 2, "
              "--warmup-iters >= 0", file=sys.stderr)  # fmt: skip
        return 2
    from testbed.modelling import measure_lockstep

    names = [n for n in args.compressors.split(",") if n]
    threads = max(1, (os.cpu_count() or 1) // args.hosts)
    floors: dict[str, list[float]] = {n: [] for n in names}
    trials: dict[str, list[float]] = {n: [] for n in names}
    testbed("up", "--name", NAME, "--hosts", str(args.hosts), "--subnet", SUBNET, "--recreate")
    try:
        with tempfile.TemporaryDirectory(prefix="fvt-") as out:
            for rep in range(args.repeats):
                got = measure_lockstep(args.hosts, args.model, args.batch_size, names, None, image_size=None,
                                       seq_len=None, iters=args.iters, bucket_cap_mb=25, threads=threads,
                                       device="cpu", fresh=not args.warm)  # fmt: skip
                for n in names:
                    floors[n].append(got["codecs"][n]["step_s"] * 1e3)
                    row = json.loads(testbed("run", "--name", NAME, "--bw", "none", "--compressor", n, "--model",
                                             args.model, "--batch-size", str(args.batch_size), "--iters",
                                             str(args.iters), "--warmup-iters", str(args.warmup_iters),
                                             "--bucket-cap-mb", "25", "--no-probe", "--seed", str(1000 + rep),
                                             "--out", out, "--json"))["row"]  # fmt: skip
                    trials[n].append(row["iter_time_s_p50"] * 1e3)
                    print(f"repetition {rep + 1}, {n}: floor {floors[n][-1]:.0f} ms, trial {trials[n][-1]:.0f} ms",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        subprocess.run([sys.executable, "-m", "testbed.cli", "down", "--name", NAME], cwd=REPO,
                       capture_output=True, timeout=300)  # fmt: skip
    how = "after the compute, one launch" if args.warm else "each in processes of its own"
    print(f"{args.model} bs{args.batch_size}, {args.hosts} hosts, floors {how}, {args.iters} steps; trials unshaped, "
          f"{args.warmup_iters} warm-up steps (ms)\n")  # fmt: skip
    print("| compressor | floors | trials | trial - floor | median floor | median trial |")
    print("|---|---|---|---|---|---|")
    for n in names:
        diff = [t - f for f, t in zip(floors[n], trials[n], strict=True)]
        print(f"| {n} | {', '.join(f'{x:.0f}' for x in floors[n])} | {', '.join(f'{x:.0f}' for x in trials[n])} | "
              f"{', '.join(f'{x:+.0f}' for x in diff)} | {statistics.median(floors[n]):.0f} | "
              f"{statistics.median(trials[n]):.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
