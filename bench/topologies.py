"""Cluster shapes benchmark (issue 36): measured vs predicted iteration time at 4 emulated hosts for
(a) one straggler at 1/2, 1/5, 1/10 of the rate, (b) 2 racks at 1:1, 1:2, 1:4 oversubscription, (c) 0, 1, 4 flows of
cross traffic; sync SGD, PowerSGD, ACP-SGD, signSGD and Top-K.

    python bench/topologies.py                                # full (quiet machine): see docs/benchmarks.md
    python bench/topologies.py --smoke --model mlp            # one point per shape, tiny model (a few minutes)

The prediction per trial: the compressor's measured flat trial (every link at --bw, no cross traffic), plus the
change of its collective's time when the ring's bottleneck (testbed.perfmodel.ring_bottleneck: the slowest host
link, the spine's share per cross-rack step, the share cross traffic leaves) replaces the flat rate, and, with cross
traffic, each ring step waits half the RTT the trial measured to the ring neighbour while the flows ran (its row's
loaded_rtt_s: the standing queue the flows keep):

    t_pred(shape) = t_meas(flat) + T_coll(payload, n, B_bottleneck, q) - T_coll(payload, n, B_flat, 0)

(T_coll: ring all-reduce, or all-gather for signSGD and Top-K, with their rounds, at the efficiency `testbed
calibrate` measured on the flat cluster at that rate: before the trials the bench calibrates every link at each rate
a bottleneck will have, since a collective gets a smaller fraction of a slow link than of a fast one, 0.74 of
10 Mbit/s and more of 100 Mbit/s, and a ring with one slow link gets what a flat ring at that rate gets; measured
2026-12-04, docs/topologies.md). Prints one Markdown table per shape (measured, predicted, error, bounding link) and
the median and worst absolute error. Needs root; uses its own cluster name and removes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import testbed.perfmodel as pm
from runners import catalog
from shaping.units import format_rate, parse_rate_bps
from testbed import cross_traffic, trial_shape

NAME = "benchtopo"
REPO = Path(__file__).resolve().parents[1]
COMPRESSORS = ("syncsgd", "powersgd", "acpsgd", "signsgd", "topk")
STRAGGLER = (2, 5, 10)
OVERSUB = (1, 2, 4)
CROSS = (0, 1, 4)


def cli(*args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO, check=False)  # fmt: skip


def up(hosts: int, bw: str, *flags: str) -> None:
    done = cli("up", "--name", NAME, "--hosts", str(hosts), "--bw", bw, "--recreate", *flags)
    if done.returncode:
        sys.exit(f"testbed up failed: {done.stderr.strip()}")


def run(args, out: Path, comp: str, *flags: str) -> dict:
    argv = ["run", "--name", NAME, "--bw", args.bw, "--compressor", comp, "--model", args.model, "--iters",
            str(args.iters), "--warmup-iters", str(args.warmup), "--no-probe", "--out", str(out), "--json", "--rerun",
            "--timeout", str(args.trial_timeout), *flags]  # fmt: skip
    done = cli(*argv, timeout_s=args.trial_timeout + 300)
    if done.returncode not in (0, 1):
        sys.exit(f"testbed {' '.join(argv)}: {done.stderr.strip()}")
    return json.loads(done.stdout)["row"]


def calibrate(rates_bps: list[float], profiles: Path, timeout_s: int):
    """Calibrate the flat cluster at each rate (every link shaped at it) and return the terms interpolated by rate."""
    bws = ",".join(f"{int(r)}bit" for r in sorted(rates_bps))
    done = cli("calibrate", "--name", NAME, "--bw", bws, "--sizes", "256kb,1mb,4mb", "--reps", "3", "--out",
               str(profiles), timeout_s=timeout_s)  # fmt: skip
    if done.returncode:
        sys.exit(f"testbed calibrate --bw {bws} failed: {done.stderr.strip()}")
    calibrations = pm.find_calibrations(profiles)
    return pm.terms_for(calibrations, len(calibrations) and calibrations[0].world_size)


def coll_s(comp: str, payload: float, terms, n: int, rate: float, queue_delay_s: float = 0.0) -> float:
    """The compressor's collective at `rate` with the calibrated terms there (without the compute-contention term,
    which the flat trial already carries; the row's payload of an all-gather is this rank's share)."""
    entry = catalog.compressor(comp)
    net = terms.network(n, rate, extra_latency_s=queue_delay_s)
    return pm.collective_time_s(entry.collective, payload, entry.rounds, net, beside_compute_s=0.0)


def predict(flat: dict, comp: str, terms, n: int, flat_bps: float, lay: pm.Layout) -> tuple[float, str]:
    b = pm.ring_bottleneck(lay)
    payload = flat["payload_bytes_per_iter"] or 0.0
    rate = b.rate_bps if b.bounded else flat_bps
    extra = coll_s(comp, payload, terms, n, rate, lay.queue_delay_s) - coll_s(comp, payload, terms, n, flat_bps)
    return flat["iter_time_s_p50"] + extra, b.link


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bw", default="100mbit", help="every host link's rate (default 100mbit)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compressors", default=",".join(COMPRESSORS))
    p.add_argument("--trial-timeout", type=int, default=3600,
                   help="seconds per trial (run --timeout; default 3600): sync SGD of ResNet-18 with a straggler at "
                        "10 Mbit/s steps about a minute, and `run`'s own default of 600 s stopped it (2026-12-04)")
    p.add_argument("--smoke", action="store_true", help="one point per shape (1/10, 1:4, 1 flow)")
    args = p.parse_args()
    comps = args.compressors.split(",")
    n, flat_bps = args.hosts, parse_rate_bps(args.bw, "--bw")
    hosts = [f"h{i}" for i in range(n)]
    stragglers, oversubs, crosses = ((10,), (4,), (1,)) if args.smoke else (STRAGGLER, OVERSUB, CROSS[1:])
    errors: list[float] = []
    tables: list[str] = []
    out = Path(tempfile.mkdtemp(prefix="benchtopo-"))
    straggler_layouts = {f: trial_shape.layout(hosts, flat_bps, {"h1": flat_bps // f}) for f in stragglers}
    cross_layouts = {k: trial_shape.layout(hosts, flat_bps, {}, cross_pairs=cross_traffic.pairs(n, k)) for k in crosses}
    rack_layouts = {r: trial_shape.layout(hosts, flat_bps, {}, rack_of=[i * 2 // n for i in range(n)],
                                          uplink_bps=(n // 2) * flat_bps // r) for r in oversubs}  # fmt: skip
    rates = {flat_bps} | {b.rate_bps for lay in (*straggler_layouts.values(), *cross_layouts.values(),
                                                 *rack_layouts.values())
                          if (b := pm.ring_bottleneck(lay)).bounded and b.rate_bps < flat_bps}  # fmt: skip
    try:
        up(n, args.bw)
        terms = calibrate(sorted(rates), out / "profiles", args.trial_timeout)
        print(f"calibrated at {', '.join(format_rate(int(r)) for r in sorted(rates))}: {terms.describe()}",
              file=sys.stderr, flush=True)  # fmt: skip
        up(n, args.bw)  # calibrate leaves the last rate on every link
        flat = {c: run(args, out, c) for c in comps}

        def row(shape: str, comp: str, meas: dict, lay: pm.Layout) -> str:
            if meas["status"] != "ok" or flat[comp]["status"] != "ok":
                return f"| {shape} | {comp} | {meas['status']} | | | |"
            pred, link = predict(flat[comp], comp, terms, n, flat_bps, lay)
            m = meas["iter_time_s_p50"]
            err = (pred - m) / m
            if shape != "flat":  # the flat trial is the prediction's own base: its error is 0 by construction
                errors.append(abs(err))
            line = f"| {shape} | {comp} | {m * 1e3:.0f} | {pred * 1e3:.0f} | {err:+.0%} | {link} |"
            print(line, file=sys.stderr, flush=True)  # as it comes: a long run stopped early keeps what it measured
            return line

        head = "| shape | compressor | measured ms | predicted ms | error | bounding link |\n|---|---|---|---|---|---|"
        lines = [head]
        for f, lay in straggler_layouts.items():
            slow = flat_bps // f
            for c in comps:
                meas = run(args, out, c, "--host-bw", f"h1={slow}bit")
                lines.append(row(f"h1 at 1/{f} ({format_rate(slow)})", c, meas, lay))
        for c in comps:
            lines.append(row("flat", c, flat[c], trial_shape.layout(hosts, flat_bps, {})))
        for k in crosses:
            for c in comps:
                meas = run(args, out, c, "--cross-traffic", str(k))
                lay = trial_shape.layout(hosts, flat_bps, {}, cross_pairs=cross_traffic.pairs(n, k),
                                         loaded_rtt_s=meas.get("loaded_rtt_s"))  # fmt: skip
                lines.append(row(f"{k} cross flow{'s' * (k != 1)}", c, meas, lay))
        tables.append("\n".join(lines))
        lines = [head]
        for ratio, lay in rack_layouts.items():
            up(n, args.bw, "--racks", "2", "--uplink", f"{lay.uplink_bps}bit")
            for c in comps:  # a store per ratio: a rack trial has the flat trial's id (racks are the cluster's)
                meas = run(args, out / f"racks-1to{ratio}", c)
                lines.append(row(f"2 racks 1:{ratio}", c, meas, lay))
        tables.append("\n".join(lines))
    finally:
        cli("down", "--name", NAME)
    print(f"{n} hosts at {args.bw}, {args.model}, {args.iters} measured iterations, median of the iterations\n")
    print("\n\n".join(tables))
    if errors:
        print(f"\nabsolute error: median {statistics.median(errors):.0%}, worst {max(errors):.0%} "
              f"({len(errors)} points)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
