"""Cluster shapes benchmark (issue 36): measured vs predicted iteration time at 4 emulated hosts for
(a) one straggler at 1/2, 1/5, 1/10 of the rate, (b) 2 racks at 1:1, 1:2, 1:4 oversubscription, (c) 0, 1, 4 flows of
cross traffic; sync SGD, PowerSGD, ACP-SGD, signSGD and Top-K.

    python bench/topologies.py                                # full (quiet machine): see docs/benchmarks.md
    python bench/topologies.py --smoke --model mlp            # one point per shape, tiny model (a few minutes)
    python bench/topologies.py --out DIR                      # resumes: trials and calibrations stored in DIR reused

The prediction per trial: the compressor's measured flat iteration time (every link at --bw, no cross traffic; the
median of --flat-launches launches, seeds 0..K-1: one launch's compute speed can differ from the next one's by 20 %
and more with 4 ranks on 2 cores), plus what its collective at the ring's bottleneck (testbed.perfmodel.ring_bottleneck:
the slowest host link, the spine's share per cross-rack step) takes beyond the flat launches' measured time on the
wire (perfmodel.from_flat_trials_s, which the report's "from flat" column uses too; the wait for shared cores that the
flat wire time holds hides under a slower link's transfer):

    t_pred(shape) = median t_meas(flat) + max(0, T_coll(payload, n, terms at B_bottleneck) - wire_meas(flat))

(sync SGD's rows carry no wire time: there the change T_coll(at B_bottleneck) - T_coll(at B_flat); the first runs used
that change for every compressor, and over-predicted the small-message compressors' straggler trials by 18-28 %
while their launches agreed within 10 %, docs/benchmarks.md)

(T_coll: ring all-reduce, or all-gather for signSGD and Top-K, with their rounds, with the terms `testbed calibrate`
measured on the flat cluster at that rate: before the trials the bench calibrates every link at each rate a bottleneck
will have: a collective gets 0.67-0.82 of a shaped link here, not all of it, and a ring with one slow link gets what a
flat ring at that rate gets; measured 2026-12-04, docs/topologies.md). With cross traffic the terms are those of a
calibration measured beside the same flows (`testbed calibrate --cross-traffic N` at --bw): what the flows leave a
collective of each size, its loaded round trips included, measured rather than derived from a fair share and half the
loaded RTT (that derivation missed by -72 % to +67 %; this one by -45 % to +56 %, while the same cross-traffic trial
moved by up to 65 % from one launch to the next on 2 cores: docs/benchmarks.md). Prints one Markdown table per shape
(measured, predicted, error, bounding link) and the median and worst absolute error. Needs root; uses its own cluster
name and removes it.

The measurement it is held to is a median too: each shaped trial is launched --launches times (seeds 0..K-1) unless
the compressor's flat launches ran within --one-launch-within % of each other (sync SGD, whose step is the wire), and
the table shows every launch. One launch of a compute-bound compressor on 2 shared cores is not a 10 % measurement.
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
from testbed.cluster.base import rack_members
from testbed.report.analysis import launch_spread_pct
from testbed.results import ResultsStore

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
    """One trial's row: the one stored ok in `out` when there is one (a resumed bench), else a new measurement."""
    argv = ["run", "--name", NAME, "--bw", args.bw, "--compressor", comp, "--model", args.model, "--iters",
            str(args.iters), "--warmup-iters", str(args.warmup), "--no-probe", "--out", str(out), "--json",
            "--timeout", str(args.trial_timeout), *flags]  # fmt: skip
    plan = cli(*argv, "--dry-run")
    if plan.returncode:
        sys.exit(f"testbed {' '.join(argv)} --dry-run: {plan.stderr.strip()}")
    stored = ResultsStore(out).find(json.loads(plan.stdout)["trial_id"]) if out.is_dir() else None
    if stored is not None and stored["status"] == "ok":
        return stored
    done = cli(*argv, timeout_s=args.trial_timeout + 300)
    if done.returncode not in (0, 1):
        sys.exit(f"testbed {' '.join(argv)}: {done.stderr.strip()}")
    return json.loads(done.stdout)["row"]


def calibrate(rates_bps: list[float], profiles: Path, n: int, timeout_s: int, cross_traffic: int = 0,
              sizes: str = "256kb,1mb,4mb", reps: int = 3):  # fmt: skip
    """Calibrate the flat cluster at each rate (every link shaped at it; beside `cross_traffic` flows) that `profiles`
    has no such calibration of for n ranks, and return the terms interpolated by rate."""
    found = pm.find_calibrations(profiles)
    have = {c.rate_bps for c in found if c.world_size == n and c.cross_traffic == cross_traffic}
    missing = [r for r in sorted(rates_bps) if int(r) not in have]
    if missing:  # else the ones read above are all there is
        bws = ",".join(f"{int(r)}bit" for r in missing)
        done = cli("calibrate", "--name", NAME, "--bw", bws, "--sizes", sizes, "--reps", str(reps), "--out",
                   str(profiles), "--cross-traffic", str(cross_traffic), timeout_s=timeout_s)  # fmt: skip
        if done.returncode:
            sys.exit(f"testbed calibrate --bw {bws} --cross-traffic {cross_traffic} failed: {done.stderr.strip()}")
        found = pm.find_calibrations(profiles)  # with the new ones
    return pm.terms_for(found, n, cross_traffic=cross_traffic)


def coll_s(comp: str, payload: float, terms, n: int, rate: float) -> float:
    """The compressor's collective at `rate` with the calibrated terms there (without the compute-contention term,
    which the flat trial already carries; the row's payload of an all-gather is this rank's share)."""
    entry = catalog.compressor(comp)
    net = terms.network(n, rate)
    return pm.collective_time_s(entry.collective, payload, entry.rounds, net, beside_compute_s=0.0)


def base_s(launches: list[dict]) -> float:
    """The flat iteration time a prediction starts from: the median over the flat launches (a launch's compute speed
    is fixed for its length and differs from the next one's on 2 shared cores)."""
    return statistics.median(r["iter_time_s_p50"] for r in launches)


def flat_wire_s(launches: list[dict]) -> float | None:
    """The flat launches' median time on the wire per iteration (the row's comm_wire_s: the union of the rank's
    collectives, issue to completion, compute contention included); None where the rows lack it (sync SGD's built-in
    all-reduce has no hook marks)."""
    wire = [r["comm_wire_s"] for r in launches if r.get("comm_wire_s") is not None and r["comm_wire_s"] == r["comm_wire_s"]]
    return statistics.median(wire) if wire else None


def predict(launches: list[dict], comp: str, terms, n: int, flat_bps: float, lay: pm.Layout,
            beside=None, rule: str = "wire") -> tuple[float, str]:  # fmt: skip
    """The shaped trial's iteration time from the flat launches, as the report predicts it from the flat trials
    (perfmodel.from_flat_trials_s): their median plus what the collective at the ring's bottleneck (`beside`: with
    the terms calibrated beside the trial's cross traffic, at the flat rate) takes beyond the flat launches' measured
    time on the wire. Rule "change" (the rule before 2026-12-04 20:00 UTC) ignores the wire time: the change of the
    calibrated collective, t = median t_flat + T_coll(bottleneck) - T_coll(flat)."""
    b = pm.ring_bottleneck(lay)
    payload = launches[0]["payload_bytes_per_iter"] or 0.0
    if beside is not None:
        t_b, link = coll_s(comp, payload, beside, n, flat_bps), f"{b.link}, calibrated beside them"
    else:
        t_b, link = coll_s(comp, payload, terms, n, b.rate_bps if b.bounded else flat_bps), b.link
    wire = flat_wire_s(launches) if rule == "wire" else None
    return pm.from_flat_trials_s(base_s(launches), wire, t_b, coll_s(comp, payload, terms, n, flat_bps)), link


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
    p.add_argument("--shapes", default="stragglers,racks,cross",
                   help="which shapes to measure, comma-separated (default: all three)")
    p.add_argument("--cross-sizes", default="1mb,4mb,25mb",
                   help="message sizes of the calibrations beside cross traffic, up to the trials' DDP bucket "
                        "(default %(default)s, 2 reps: beside one flow a 4 MB all-reduce got 61 Mbit/s of busbw, "
                        "sync SGD's 25 MB buckets about 45; 2026-12-04)")  # fmt: skip
    p.add_argument("--flat-launches", type=int, default=3,
                   help="flat trials per compressor (seeds 0..K-1), the median their base (default 3)")
    p.add_argument("--launches", type=int, default=3,
                   help="launches of each shaped trial (seeds 0..K-1), the median its measurement (default 3): the "
                        "same trial ran up to 65 %% apart from one launch to the next on 2 cores (2026-12-04)")
    p.add_argument("--one-launch-within", type=float, default=5.0, metavar="PCT",
                   help="a compressor whose flat launches ran within PCT %% of each other is launched once per shape "
                        "(default %(default)s: sync SGD, whose step is the wire, ran 2 %% apart)")
    p.add_argument("--rule", choices=("wire", "change"), default="wire",
                   help="wire (default): flat median + max(0, T_coll(bottleneck) - the flat launches' wire time); "
                        "change: flat median + T_coll(bottleneck) - T_coll(flat), the rule before 2026-12-04. With "
                        "--out of a finished run, every trial and calibration is reused: it re-predicts, measures nothing")
    p.add_argument("--out", type=Path,
                   help="results and calibrations (default: a new temporary directory); trials and calibrations "
                        "already stored there are reused, so a stopped or extended run resumes")  # fmt: skip
    args = p.parse_args()
    for flag, k in (("--flat-launches", args.flat_launches), ("--launches", args.launches)):
        if k < 1:
            p.error(f"{flag} {k}: expected 1 or more")
    shapes = set(args.shapes.split(","))
    if not shapes or not shapes <= {"stragglers", "racks", "cross"}:
        p.error(f"--shapes {args.shapes}: expected a comma-separated subset of stragglers,racks,cross")
    comps = args.compressors.split(",")
    n, flat_bps = args.hosts, parse_rate_bps(args.bw, "--bw")
    hosts = [f"h{i}" for i in range(n)]
    stragglers, oversubs, crosses = ((10,), (4,), (1,)) if args.smoke else (STRAGGLER, OVERSUB, CROSS[1:])
    stragglers, oversubs, crosses = (v if k in shapes else () for k, v in
                                     (("stragglers", stragglers), ("racks", oversubs), ("cross", crosses)))  # fmt: skip
    errors: dict[str, list[float]] = {"stragglers": [], "racks": [], "cross traffic": []}
    tables: list[str] = []
    out = args.out or Path(tempfile.mkdtemp(prefix="benchtopo-"))
    out.mkdir(parents=True, exist_ok=True)  # calibrate writes into out/profiles and wants its parent there
    straggler_layouts = {f: trial_shape.layout(hosts, flat_bps, {"h1": flat_bps // f}) for f in stragglers}
    cross_layouts = {k: trial_shape.layout(hosts, flat_bps, {}, cross_pairs=cross_traffic.pairs(n, k)) for k in crosses}
    rack_of = [j for j, members in enumerate(rack_members(n, 2)) for _ in members]  # as `up --racks 2` places them
    rack_layouts = {r: trial_shape.layout(hosts, flat_bps, {}, rack_of=rack_of, uplink_bps=(n // 2) * flat_bps // r)
                    for r in oversubs}  # fmt: skip
    rates = {flat_bps} | {b.rate_bps for lay in (*straggler_layouts.values(), *rack_layouts.values())
                          if (b := pm.ring_bottleneck(lay)).bounded and b.rate_bps < flat_bps}  # fmt: skip
    try:
        up(n, args.bw)
        terms = calibrate(sorted(rates), out / "profiles", n, args.trial_timeout)
        print(f"calibrated at {', '.join(format_rate(int(r)) for r in sorted(rates))}: {terms.describe()}",
              file=sys.stderr, flush=True)  # fmt: skip
        beside = {k: calibrate([flat_bps], out / "profiles", n, args.trial_timeout, cross_traffic=k,
                               sizes=args.cross_sizes, reps=2) for k in crosses}  # fmt: skip
        up(n, args.bw)  # calibrate leaves the last rate on every link
        flat = {c: [run(args, out, c, "--seed", str(k)) for k in range(args.flat_launches)] for c in comps}

        def measure(comp: str, *flags: str) -> list[dict]:
            """The shaped trial's launches (seeds 0..K-1), or one where the compressor's flat launches repeat."""
            times = [r["iter_time_s_p50"] for r in flat[comp] if r["status"] == "ok"]
            repeats = len(times) > 1 and launch_spread_pct(times) <= args.one_launch_within
            return [run(args, out, comp, "--seed", str(k), *flags) for k in range(1 if repeats else args.launches)]

        def row(kind: str, shape: str, comp: str, launches: list[dict], lay: pm.Layout, cross_terms=None) -> str:
            bad = [r["status"] for r in (*launches, *flat[comp]) if r["status"] != "ok"]
            if bad:
                return f"| {shape} | {comp} | {', '.join(bad)} | | | | |"
            pred, link = predict(flat[comp], comp, terms, n, flat_bps, lay, cross_terms, args.rule)
            m = base_s(launches)
            err = (pred - m) / m
            errors[kind].append(abs(err))
            each = " / ".join(f"{r['iter_time_s_p50'] * 1e3:.0f}" for r in launches)
            line = f"| {shape} | {comp} | {m * 1e3:.0f} | {each} | {pred * 1e3:.0f} | {err:+.0%} | {link} |"
            print(line, file=sys.stderr, flush=True)  # as it comes: a long run stopped early keeps what it measured
            return line

        head = ("| shape | compressor | measured ms (median) | launches ms | predicted ms | error | bounding link |\n"
                "|---|---|---|---|---|---|---|")
        lines = [head]
        for f, lay in straggler_layouts.items():
            slow = flat_bps // f
            for c in comps:
                meas = measure(c, "--host-bw", f"h1={slow}bit")
                lines.append(row("stragglers", f"h1 at 1/{f} ({format_rate(slow)})", c, meas, lay))
        for c in comps:  # the prediction's base, not a prediction: the launches and how far apart they ran
            times = [r["iter_time_s_p50"] for r in flat[c] if r["status"] == "ok"]
            spread = f"{launch_spread_pct(times):.0f} % apart" if len(times) > 1 else ""
            lines.append(f"| flat, {len(flat[c])} launch{'es' * (len(flat[c]) != 1)} | {c} | "
                         f"{base_s(flat[c]) * 1e3:.0f} (the base) | {' / '.join(f'{t * 1e3:.0f}' for t in times)} | "
                         f"| {spread} | every host link ({args.bw}) |")  # fmt: skip
        for k in crosses:
            for c in comps:
                meas = measure(c, "--cross-traffic", str(k))
                lines.append(row("cross traffic", f"{k} cross flow{'s' * (k != 1)}", c, meas, cross_layouts[k], beside[k]))
        tables.append("\n".join(lines))
        lines = [head]
        for ratio, lay in rack_layouts.items():
            up(n, args.bw, "--racks", "2", "--uplink", f"{lay.uplink_bps}bit")
            for c in comps:  # beside the flat trials: the racks are part of a trial's id
                meas = measure(c)
                lines.append(row("racks", f"2 racks 1:{ratio}", c, meas, lay))
        tables.append("\n".join(lines))
    finally:
        cli("down", "--name", NAME)
    print(f"{n} hosts at {args.bw}, {args.model}, {args.iters} measured iterations, median of the iterations\n")
    print("\n\n".join(tables))
    every = [e for errs in errors.values() for e in errs]
    if every:
        print(f"\nabsolute error: median {statistics.median(every):.0%}, worst {max(every):.0%} ({len(every)} points)")
        for kind, errs in errors.items():  # per shape: the all-points median can hide one shape's errors
            if errs:
                print(f"  {kind}: median {statistics.median(errs):.0%}, worst {max(errs):.0%} ({len(errs)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
