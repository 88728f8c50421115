"""`testbed profile`, `testbed calibrate`, `testbed predict` and `testbed report`: the performance model and the
report on the CLI.

`add_commands(subparsers)` adds the four subcommands; each handler takes the parsed args and returns the exit code.
Errors are `InputError`s (one line, exit 2) raised before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from runners.contract import DEFAULT_PROBE_S
from testbed import model_views, modelling
from testbed import perfmodel as pm
from testbed.errors import InputError, TestbedError, why_not_a_file

DEFAULT_PROFILES_DIR = "profiles"
DEFAULT_BW_RANGE = "10mbit..10gbit"
MAX_POINTS = 1000  # grid points of a --bw range: plenty for a smooth curve, and predict stays well under a second
MAX_THREADS = 1024
MAX_COLOCATED = 256  # processes a co-located profile may start


def _console() -> Console:
    # bound to the current sys.stdout (so tests and pipes capture it); wide tables when not on a terminal
    return Console(width=None if sys.stdout.isatty() else 160)


# ---------------------------------------------------------------------------------------------- argument parsing
def parse_bandwidths(text: str, points: int) -> list[float]:
    """`10mbit..10gbit` (log grid of `points`), `100mbit,1gbit,10gbit` (a list) or `1gbit` (one rate). `none` (an
    unshaped link, in a list or alone) is math.inf until `resolve_unshaped` puts it where the calibration says."""
    from shaping.units import is_unshaped, parse_rate_bps

    text = text.strip()
    if ".." in text:
        lo_s, _, hi_s = text.partition("..")
        lo, hi = parse_rate_bps(lo_s, "--bw"), parse_rate_bps(hi_s, "--bw")
        if lo >= hi:
            raise InputError(f"--bw {text}: the range must go from low to high, e.g. 10mbit..10gbit")
        if not 2 <= points <= MAX_POINTS:
            raise InputError(f"--points {points}: a range takes at least 2 points and at most {MAX_POINTS}")
        return pm.log_grid(lo, hi, points)
    parts = text.split(",")
    if len(parts) > 1 and not all(part.strip() for part in parts):  # `--bw "$A,$B"` with B unset
        raise InputError(f"--bw {text!r}: an item of the list is empty (an unset variable?)")
    rates = sorted({math.inf if is_unshaped(part) else float(parse_rate_bps(part, "--bw"))
                    for part in parts if part.strip()})  # fmt: skip
    if not rates:
        raise InputError(f"--bw {text!r}: expected a rate (1gbit), a list (100mbit,1gbit) or a range (10mbit..10gbit)")
    return rates


def resolve_unshaped(bandwidths_bps: list[float], terms: pm.ModelTerms | pm.TermsByRate,
                     world_size: int) -> tuple[list[float], float | None]:  # fmt: skip
    """`none` (math.inf from parse_bandwidths) where an unshaped calibration sits on the rate axis (the all-reduce
    bandwidth it reached, or above every shaped calibration: terms.axis_rates_bps); InputError without one. Returns
    the rates and that rate (None if unused)."""
    if math.inf not in bandwidths_bps:
        return bandwidths_bps, None
    at = terms.unshaped_rate_bps
    if not at:
        raise InputError(
            f"--bw none: an unshaped link is predicted at the all-reduce bandwidth an unshaped calibration of "
            f"{world_size} ranks reached, and there is none (`testbed calibrate --bw none`); or give the rate, e.g. "
            "10gbit"
        )
    return sorted({at if b == math.inf else b for b in bandwidths_bps}), at


def parse_compressors(text: str | None) -> list[str] | None:
    """Built-in names, installed plugins' names (as their MODULE:FACTORY spec) and MODULE:FACTORY specs."""
    if not text:
        return None
    from runners import catalog
    from testbed.plugins import resolve_name

    names = [resolve_name(n) for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in pm.COMPRESSORS and not catalog.is_plugin_spec(n)]
    if unknown:
        raise InputError(
            f"--compressors {','.join(unknown)}: unknown; expected names from {', '.join(pm.COMPRESSORS)}, an installed "
            "plugin's name or MODULE:FACTORY"
        )
    for n in names:
        if catalog.is_plugin_spec(n):
            try:
                catalog.parse_plugin_spec(n)
            except ValueError as e:
                raise InputError(str(e)) from None
    return names


def _positive(text: str, flag: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected a positive number") from None
    if not 0 < v < float("inf"):
        raise InputError(f"{flag} {text}: expected a positive number, finite")
    return v


def _efficiency(text: str) -> float:
    v = _positive(text, "--efficiency")
    if v > 1:
        raise InputError(f"--efficiency {text}: expected the fraction of the link a collective achieves, in (0, 1]")
    return v


def check_model_name(model: str) -> str:
    from runners import catalog

    if model not in catalog.MODELS:
        raise InputError(f"--model {model!r}: unknown; accepted {', '.join(catalog.MODEL_NAMES)}")
    return model


def profile_threads(threads: int | None, colocated: int, device: str) -> int:
    """--threads as given; unset, with --colocated N on the CPU, what a local trial of N ranks gives each rank
    (`cluster.base.shared_cpu_threads`, as LocalCluster.threads_per_rank: cores // N, at least 1). With torch's default instead, each of 4 co-located ranks
    on 2 cores ran 2 threads: mlp batch 8's compute measured 5.1 ms (0.9 ms with 1 thread) and sync SGD's step in
    place 45 ms (6.5 ms), against a 14 ms trial step at 100 Mbit/s (2026-12-04, `testbed profile --model mlp
    --batch-size 8 --compressors syncsgd,powersgd --colocated 4 --threads 0`, then `--threads 1`)."""
    if threads is not None:
        return threads
    if device == "cpu" and colocated > 1:
        from testbed.cluster.base import shared_cpu_threads

        return shared_cpu_threads(colocated)
    return 0


def check_profile_cluster(name: str, colocated: int, device: str) -> None:
    """`testbed profile --on NAME`: a cluster `testbed up` made on this machine, with a host for each co-located
    rank (InputError otherwise, before anything is changed)."""
    from testbed.cluster import backends

    if colocated < 2:
        raise InputError(f"--on {name}: measures co-located ranks on the cluster's hosts; give --colocated N >= 2")
    if device != "cpu":
        raise InputError(f"--on {name} with --device {device}: accepted only on the CPU (emulated hosts share this "
                         "machine's cores, not its GPUs); profile a GPU host with --colocated on it")  # fmt: skip
    hosts = backends.open_cluster(name).hosts()
    if not all(h.emulated for h in hosts):
        raise InputError(f"--on {name}: its hosts are not emulated hosts of this machine; accepted: a cluster "
                         "`testbed up` made here without --inventory")  # fmt: skip
    if len(hosts) < colocated:
        raise InputError(f"--on {name}: {len(hosts)} host(s) for --colocated {colocated}; expected at least one host "
                         "a rank")  # fmt: skip


def on_cluster(name: str, wait_s: float, model: str) -> Callable[[], AbstractContextManager[modelling.OnCluster]]:
    """`testbed profile --on NAME`: what measure_profile enters around the co-located measurement (the solo one
    before it needs no cluster, and a Ctrl-C there ends the command at once, nothing changed): the cluster's lease
    (refused or waited for as a trial's), its shaping cleared and put back (cluster_lease.links_cleared), and the
    signal handlers a trial has (a signal ends the ranks; the shaping is put back, nothing stored)."""
    from testbed.cluster import backends
    from testbed.cluster_lease import hold, links_cleared
    from testbed.launch import STOP, stop_on_signals

    @contextlib.contextmanager
    def entered() -> Iterator[modelling.OnCluster]:
        with hold(name, wait_s=wait_s):  # one command at a time shapes and measures a cluster
            cluster = backends.open_cluster(name)
            stop_on_signals()  # Ctrl-C, SIGTERM, SIGHUP: the ranks are ended and the shaping put back
            with links_cleared(cluster, f"co-located profile of {model}") as remember:
                yield modelling.OnCluster(cluster, remember, STOP)

    return entered


def check_profile_flags(args: argparse.Namespace) -> None:
    """The profile flags that the measurement would otherwise find out about only after importing torch."""
    import math

    from runners import catalog

    check_model_name(args.model)
    for flag, value, lo, hi in (
        ("--batch-size", args.batch_size, 1, None),
        ("--iters", args.iters, 1, None),
        ("--threads", args.threads, 0, MAX_THREADS),
        ("--colocated", getattr(args, "colocated", 1), 1, MAX_COLOCATED),
        ("--image-size", args.image_size, *catalog.IMAGE_SIZE_RANGE),
        ("--seq-len", args.seq_len, *catalog.SEQ_LEN_RANGE),
    ):
        if value is not None and (value < lo or (hi is not None and value > hi)):
            bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise InputError(f"{flag} {value}: expected an integer {bound}")
    if not (math.isfinite(args.bucket_cap_mb) and 0 < args.bucket_cap_mb <= 1024):
        raise InputError(f"--bucket-cap-mb {args.bucket_cap_mb:g}: expected a number in (0, 1024] (MB)")


def _latency_s(text: str) -> float:
    from shaping.units import parse_time_s

    return parse_time_s(text, "--latency")


def _model_flags(p: argparse.ArgumentParser, auto: bool = False) -> None:
    p.add_argument(
        "--latency",
        help="per-message latency alpha, e.g. 50us, 1ms (default: the calibration's, else 50us)",
    )
    p.add_argument(
        "--efficiency",
        help="fraction of the link rate a collective achieves, (0, 1] (default: the calibration's, else 1.0"
        + ("; 'auto' fits it from communication-bound syncsgd trials)" if auto else ")"),
    )
    p.add_argument(
        "--calibration",
        default="auto",
        help="calibration JSON of `testbed calibrate`, 'auto' (the one in the profiles directory for the world "
        "size, when there is one) or 'none' (defaults: 50 us, efficiency 1, no host cost). Default: auto",
    )
    p.add_argument(
        "--overlap-hooks",
        action="store_true",
        help="model compressor hooks as overlapping backward (default: they block it, as this project's "
        "hooks run their collectives synchronously)",
    )


def add_commands(subparsers: Any) -> None:
    """Add `profile`, `calibrate`, `predict` and `report` to the `testbed` argparse subparsers."""
    p = subparsers.add_parser(
        "profile",
        help="measure a model's compute and compressor costs (stored as JSON)",
        description="Measure forward/backward/optimizer time, DDP bucket readiness and each "
        "compressor's payload and encode/decode time; store them for `predict`.",
    )
    p.add_argument("--model", required=True, help="model name, e.g. resnet18")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size (default: 32)")
    p.add_argument("--compressors", help=f"comma-separated subset of {','.join(pm.COMPRESSORS)} (default: all)")
    p.add_argument("--image-size", type=int, help="input image side for vision models")
    p.add_argument("--seq-len", type=int, help="sequence length for language models")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default: 10)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket cap (default: 25)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default: cpu)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads to measure with; use what each rank gets in a trial (cores / ranks per machine; "
        "local trials give each rank cores // world size). Default: with --colocated N on the CPU, what a local "
        "trial of N ranks gives each (cores // N, at least 1); else torch's default (all cores); 0: torch's default",
    )
    p.add_argument(
        "--colocated",
        type=int,
        default=1,
        help="ranks that compute at once on the machine the trials run on (the local emulated cluster: its world "
        "size; a lab host: its ranks per host). N > 1 measures again with N processes training in lockstep, so compute, "
        "the slowest rank's lateness and (CPU) each compressor's encode/decode are timed as those ranks see them "
        "(cores, caches and memory bandwidth shared). "
        "Default: 1",
    )
    p.add_argument(
        "--on",
        metavar="NAME",
        help="run the --colocated ranks on the first N hosts of the emulated cluster NAME (rank r on host r, gloo over "
        "its veths and switch, where its trials' ranks talk) instead of as processes of this machine on loopback. "
        "For that part (the solo measurement comes first) the cluster is held as a trial holds it, its shaping "
        "cleared (the in-place floors are those of unshaped links) and put back after",
    )
    from testbed.trial_args import add_plugin_flags, add_wait_flag

    add_wait_flag(p)
    p.add_argument("--out", default=DEFAULT_PROFILES_DIR, help="directory for the JSON (default: profiles/)")
    p.add_argument("--json", action="store_true", help="print the stored profile as JSON")
    add_plugin_flags(p)
    p.set_defaults(func=cmd_profile)

    from testbed.cli_common import add_name, add_shape_flags

    p = subparsers.add_parser(
        "calibrate",
        help="measure the cluster's all-reduce and all-gather; fit the model's latency, bandwidth and host cost",
        description="All-reduce and all-gather microbenchmarks over message sizes (algbw and busbw per size, as "
        "nccl-tests) on the cluster's ranks, with the backend trials use; fits latency, effective bandwidth and the "
        "host cost per byte, stored beside the profiles for `predict` and `report`. With --bw RATE every link is "
        "shaped at RATE for the measurement, with --bw none every link is unshaped, without --bw the cluster's "
        "current shaping stays; with --bw RATE,RATE,... (e.g. 100mbit,1gbit,none) it calibrates at each in turn. "
        "Calibrations at several rates are interpolated between (by the rate a trial runs at); a prediction outside "
        "them is marked extrapolated, so list the lowest and highest rates a sweep will run at.",
    )
    add_name(p)
    add_shape_flags(p)
    p.add_argument("--world-size", type=int, help="ranks to measure with (default: every host's ranks)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="default: as trials (auto)")
    p.add_argument(
        "--sizes",
        default="16kb,256kb,1mb,4mb,16mb",
        help="message sizes (all-reduce buffer, all-gather output), comma-separated (default: %(default)s)",
    )
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per size and collective (default: 5)")
    p.add_argument("--probe-s", type=float, default=DEFAULT_PROBE_S, metavar="SECONDS",
                   help="seconds of training steps per contention measurement (the compute the collectives take "
                   "from a rank, at the smallest and largest size, per rep): most of a calibration's time at small "
                   "sizes; shorter is quicker and noisier, down to one step of the probe's CNN (at the default, at least two) "
                   "(default: %(default)g)")  # fmt: skip
    p.add_argument(
        "--cross-traffic",
        type=int,
        default=0,
        metavar="N",
        help="measure beside N bulk TCP flows between the hosts, as a trial with --cross-traffic N runs (stored "
        "apart: only predictions of trials with N flows use it; default 0)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the measurement is abandoned")
    p.add_argument("--out", default=DEFAULT_PROFILES_DIR, help="directory of the profiles (default: profiles/)")
    p.add_argument("--json", action="store_true", help="print the stored calibration as JSON")
    from testbed.trial_args import add_wait_flag

    add_wait_flag(p)
    p.set_defaults(func=cmd_calibrate)

    p = subparsers.add_parser(
        "predict",
        help="predict iteration time, speedup and crossover per compressor",
        description="Predict iteration time per compressor across a bandwidth range from a "
        "stored profile (measured first when there is none).",
    )
    p.add_argument("--model", help="model name (finds profiles/<model>-bs<batch>-<device>.json)")
    p.add_argument("--profile", help="a profile JSON measured elsewhere (e.g. on a GPU lab host)")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size of the profile (default: 32)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="profile device (default: cpu)")
    p.add_argument("--profiles", default=DEFAULT_PROFILES_DIR, help="profile directory (default: profiles/)")
    p.add_argument("--world-size", type=int, default=4, help="number of workers (default: 4)")
    p.add_argument(
        "--bw",
        default=DEFAULT_BW_RANGE,
        help="range 10mbit..10gbit (log grid), list 100mbit,1gbit, or one rate; `none` in a list or alone: an "
        "unshaped link, where an unshaped calibration sits on the rate axis: the all-reduce bandwidth it reached, or "
        "above every shaped calibration (default: %(default)s)",
    )
    p.add_argument("--points", type=int, default=25, help="grid points for a range (default: 25)")
    p.add_argument("--compute-speedup", default="1", help="what-if: forward/backward/optimizer k times faster")
    p.add_argument("--codec-speedup", default="1", help="what-if: encode/decode k times faster")
    p.add_argument("--compressors", help="comma-separated subset (default: all in the profile)")
    p.add_argument("--baseline", choices=pm.BASELINES, default="syncsgd", help="speedup baseline (default: syncsgd)")
    _model_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_predict)

    p = subparsers.add_parser(
        "report",
        help="plots and tables: measured curves beside the model",
        description="Write PNG figures, a self-contained report.html and summary.md from a results directory.",
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="results directory of `testbed run`/`sweep`")
    p.add_argument("--out", default="report", help="output directory (default: report/)")
    p.add_argument(
        "--baseline",
        choices=pm.BASELINES,
        default="syncsgd",
        help="speedup baseline: syncsgd (fp32) or the fair 16-bit all-reduce (fp16, bf16)",
    )
    p.add_argument("--profiles", help="profile directory for predicted curves (default: profiles/ when present)")
    p.add_argument("--timeline", action="append", default=[], metavar="TRIAL_ID",
                   help="also draw this trial's timeline (run with --timeline N; repeatable); every variant's trial "
                   "with a timeline at its lowest rate is drawn anyway, with its Chrome trace beside it")
    _model_flags(p, auto=True)
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(func=cmd_report)


# ---------------------------------------------------------------------------------------------- profile
def cmd_profile(args: argparse.Namespace) -> int:
    from runners import catalog
    from testbed.outputs import check_output_dir
    from testbed.plugins import check_plugin_path, inspect
    from testbed.trial_args import parse_opts, wait_seconds

    check_profile_flags(args)
    compressors = parse_compressors(args.compressors)
    check_output_dir(args.out, "--out")
    plugin_path = check_plugin_path(args.plugin_path)
    free = parse_opts(args.opt)
    plugins = [c for c in compressors or () if catalog.is_plugin_spec(c)]
    if free and not plugins:
        raise InputError("--opt applies to MODULE:FACTORY compressors in --compressors; give the built-ins' own options "
                         "in a sweep")  # fmt: skip
    for spec in plugins:  # the plugin's own one-line errors, before the measurement starts
        inspect(spec, free, plugin_path)
    wait_s = wait_seconds(args)
    if args.on is not None:
        check_profile_cluster(args.on, args.colocated, args.device)  # no such cluster, too few hosts: exit 2
    elif wait_s:
        raise InputError(f"--wait {args.wait:g}: applies to --on NAME (waiting for the cluster's lease); a profile "
                         "on this machine holds no cluster")  # fmt: skip
    measure = dict(image_size=args.image_size, seq_len=args.seq_len, iters=args.iters,
                   bucket_cap_mb=args.bucket_cap_mb, threads=profile_threads(args.threads, args.colocated, args.device),
                   colocated=args.colocated, status=_console().status, options={spec: free for spec in plugins},
                   plugin_path=plugin_path)  # fmt: skip
    if args.on is None:
        profile, path = modelling.measure_and_store(args.model, args.batch_size, compressors, args.device, args.out,
                                                    **measure)  # fmt: skip
    else:
        from testbed.launch import STOP, stop_exit_code

        try:
            profile, path = modelling.measure_and_store(args.model, args.batch_size, compressors, args.device, args.out,
                                                        on=on_cluster(args.on, wait_s, args.model),
                                                        **measure)  # fmt: skip
        except TestbedError as e:
            if not STOP.is_set():
                raise
            print(f"testbed profile: {e}; the shaping was put back and nothing was stored", file=sys.stderr)
            return stop_exit_code()
    if args.json:
        sys.stdout.write(json.dumps({"path": str(path), **pm.profile_to_dict(profile)}, indent=2) + "\n")
        return 0
    console = _console()
    console.print(model_views.profile_table(profile))
    console.print(f"stored: {path}")
    return 0


# ---------------------------------------------------------------------------------------------- calibrate
def parse_sizes(text: str, flag: str = "--sizes") -> list[int]:
    """`16kb,1mb` -> bytes (shaping.units.parse_size_bytes), sorted, distinct; errors name `flag`."""
    from shaping.units import parse_size_bytes

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InputError(f"{flag} {text!r}: expected comma-separated sizes, e.g. 16kb,1mb,16mb")
    return sorted({parse_size_bytes(p, flag) for p in parts})


def cmd_calibrate(args: argparse.Namespace) -> int:
    import math

    from testbed.calibrate import check_settings, run_calibration
    from testbed.cluster import backends
    from testbed.cluster_lease import hold
    from testbed.launch import TrialFailed, stop_exit_code, stop_on_signals
    from testbed.outputs import check_output_dir
    from testbed.trial_args import wait_seconds
    from testbed.trial_shape import check_cross_traffic

    points = calibration_points(args)  # [(shape, unshaped)], one per --bw item, all checked before anything runs
    sizes = parse_sizes(args.sizes)
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout:g}: expected a positive number of seconds")
    check_settings(sizes, args.reps, args.timeout, probe_s=args.probe_s)
    check_cross_traffic(args.cross_traffic)
    if args.world_size is not None and args.world_size < 2:
        raise InputError(f"--world-size {args.world_size}: a calibration needs at least 2 ranks")
    check_output_dir(args.out, "--out")
    wait_s = wait_seconds(args)
    backends.open_cluster(args.name)  # no such cluster: exit 2 before waiting for anything
    console = _console()
    with hold(args.name, wait_s=wait_s):  # one command at a time shapes and measures a cluster
        cluster = backends.open_cluster(args.name)
        stop_on_signals()  # Ctrl-C, SIGTERM, SIGHUP: the ranks are ended and the shaping restored
        done = []
        with console.status("calibrating...") as status:
            for shape, unshaped in points:
                at = "unshaped" if unshaped else (pm.rate_text(shape.rate_bps) if shape else "the current shaping")
                try:
                    c, path = run_calibration(
                        cluster,
                        args.out,
                        shape=shape,
                        unshaped=unshaped,
                        world_size=args.world_size,
                        backend=args.backend,
                        sizes_bytes=sizes,
                        reps=args.reps,
                        timeout_s=args.timeout,
                        cross_traffic=args.cross_traffic,
                        probe_s=args.probe_s,
                        on_phase=lambda msg, at=at: status.update(f"calibrating at {at}: {msg}..."),
                    )
                except TrialFailed as e:
                    if e.status != "interrupted":
                        raise
                    kept = f"; the {len(done)} rate(s) measured before it are stored" if done else ""
                    print(f"testbed calibrate: {e}; the calibration ({at}) was not stored, its ranks were ended and "
                          f"the shaping put back{kept}", file=sys.stderr)  # fmt: skip
                    return stop_exit_code()
                done.append((c, path))
    if args.json:  # one rate: the calibration's object (as always); several: a list of them, in --bw's order
        objs = [{"path": str(path), **pm.calibration_to_dict(c)} for c, path in done]
        sys.stdout.write(json.dumps(objs[0] if len(objs) == 1 else objs, indent=2) + "\n")
        return 0
    for c, path in done:
        console.print(model_views.calibration_table(c))
        console.print(model_views.calibration_summary(c))
        console.print(f"stored: {path} (figure {path.with_suffix('.png')})")
    return 0


def calibration_points(args: argparse.Namespace) -> list[tuple[Any, bool]]:
    """--bw as (shape, unshaped) per rate: one rate or `none` as before, or a comma-separated list (e.g.
    `100mbit,1gbit,none`: the rates a sweep will run at, so that no prediction there is extrapolated). The shaping
    flags (--burst, --delay, ...) apply to every shaped rate of a list; a rate listed twice is refused. No --bw: the
    current shaping."""
    from testbed.cli_common import bw_is_unshaped, shape_from_args

    items = [args.bw] if args.bw is None or "," not in args.bw else [x.strip() for x in args.bw.split(",")]
    flags = ("burst", "delay", "jitter", "loss")
    points, seen = [], {}
    for item in items:
        one = argparse.Namespace(**{**vars(args), "bw": item})
        unshaped = bw_is_unshaped(one)
        if unshaped and len(items) > 1:  # a list's `none` has no bucket or delay to take the flags
            for flag in flags:
                setattr(one, flag, None)
        point = (shape_from_args(one), unshaped)
        key = point[0].rate_bps if point[0] is not None else ("none" if point[1] else "current")
        if key in seen:
            raise InputError(f"--bw {args.bw}: {item!r} is the same rate as {seen[key]!r}; accepted: each rate once")
        seen[key] = item
        points.append(point)
    return points


# ---------------------------------------------------------------------------------------------- predict
def _given_latency(args: argparse.Namespace) -> float | None:
    return None if args.latency is None else _latency_s(args.latency)


def _given_efficiency(args: argparse.Namespace) -> float | None:
    return None if args.efficiency is None else _efficiency(args.efficiency)


def _check_calibration_flag(args: argparse.Namespace) -> None:
    if args.calibration not in ("auto", "none") and not Path(args.calibration).is_file():
        raise InputError(
            f"--calibration {args.calibration}: {why_not_a_file(args.calibration)}; "
            "expected a JSON file of `testbed calibrate`, auto or none"
        )


def cmd_predict(args: argparse.Namespace) -> int:
    # validate the cheap flags before a possibly long measurement
    parse_bandwidths(args.bw, args.points)
    _given_latency(args), _given_efficiency(args)
    _check_calibration_flag(args)
    _positive(args.compute_speedup, "--compute-speedup"), _positive(args.codec_speedup, "--codec-speedup")
    parse_compressors(args.compressors)
    if args.world_size < 1:
        raise InputError(f"--world-size {args.world_size}: expected >= 1")
    profile, source = modelling.resolve_profile(
        profile_path=args.profile,
        model=args.model,
        batch_size=args.batch_size,
        device=args.device,
        profiles_dir=args.profiles,
        status=_console().status,
    )
    terms = modelling.resolve_terms(
        args.calibration, args.profiles, args.world_size, latency_s=_given_latency(args), efficiency=_given_efficiency(args)
    )
    bandwidths, unshaped_bps = resolve_unshaped(parse_bandwidths(args.bw, args.points), terms, args.world_size)
    data = modelling.prediction(
        profile,
        source,
        bandwidths_bps=bandwidths,
        world_size=args.world_size,
        baseline=args.baseline,
        compressors=parse_compressors(args.compressors),
        terms=terms,
        compute_speedup=_positive(args.compute_speedup, "--compute-speedup"),
        codec_speedup=_positive(args.codec_speedup, "--codec-speedup"),
        hook_blocks_backward=not args.overlap_hooks,
    )
    data["unshaped_bps"] = unshaped_bps  # `--bw none`: the rate it stands at (None: not asked for)
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    console = _console()
    for item in model_views.prediction_view(data, profile, terms, source):
        console.print(item)
    return 0


# ---------------------------------------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    from testbed.outputs import check_output_dir
    from testbed.report import report_from_dir

    check_output_dir(args.out, "--out")
    latency_s = _given_latency(args)
    efficiency = "auto" if args.efficiency == "auto" else _given_efficiency(args)
    _check_calibration_flag(args)
    profiles_dir = args.profiles
    if profiles_dir is None and Path(DEFAULT_PROFILES_DIR).is_dir():
        profiles_dir = DEFAULT_PROFILES_DIR
    elif profiles_dir is not None and not Path(profiles_dir).is_dir():
        raise InputError(f"--profiles {profiles_dir}: no such directory; expected the --out of `testbed profile`")
    res = report_from_dir(
        args.results_dir,
        args.out,
        baseline=args.baseline,
        profiles_dir=profiles_dir,
        latency_s=latency_s,
        efficiency=efficiency,
        hook_blocks_backward=not args.overlap_hooks,
        timeline_trials=tuple(args.timeline),
        **({} if args.calibration == "auto" else {"calibrations": modelling.explicit_calibrations(args.calibration)}),
    )
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "headline": res.headline,
                    "wins": res.wins,
                    "configurations": res.configurations,
                    "baseline": args.baseline,
                    "html": str(res.html),
                    "markdown": str(res.markdown),
                    "figures": [str(p) for p in res.figures],
                    "notes": list(res.notes),
                },
                indent=2,
            )
            + "\n"
        )
        return 0
    console = _console()
    console.print(f"[bold]{res.headline}[/]")
    for n in res.notes:
        console.print(f"note: {n}")
    console.print(f"wrote {res.html}, {res.markdown} and {len(res.figures)} figure(s) in {res.out_dir}")
    return 0
