"""`testbed calibrate`: measure a cluster's collectives and store the calibration the performance model uses.

Order of work (what is undone on the way out, whatever happens, as for a trial in launch.py):
  1. resolve backend, ranks per host and world size against the cluster's hosts (as a trial is: launch_plan);
  2. shape every link at the given rate, or clear the shaping (`--bw none`: calibrated unshaped), else keep the
     cluster's current shaping (its rate is recorded); with `--cross-traffic N`, start N bulk TCP flows between the
     hosts for the length of the measurement, as a trial with `--cross-traffic N` does (testbed.cross_traffic);
  3. start one `python -m runners.collbench` rank per slot of the launch plan (torchrun environment, allowlisted
     variables, GLOO_SOCKET_IFNAME or NCCL's socket settings) in its own process group, and watch them;
  4. fetch rank 0's JSON, fit (testbed.perfmodel.fit), store `calibration-<cluster>-<backend>-p<p>-<rate>.json` beside
     the profiles (atomic write) and a figure of algbw/busbw per size beside it;
  5. end the cross traffic and put the cluster's configured shaping back.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from runners.contract import DEFAULT_PROBE_S, MAX_PROBE_S, CollBenchArgs
from shaping.plan import LinkShape
from testbed import cross_traffic as cross_flows
from testbed import launch_plan, ranks
from testbed.cluster import registry
from testbed.config import Trial
from testbed.errors import InputError, LaunchError
from testbed.perfmodel.calibration import Calibration, calibration_from_bench, load_calibration, save_calibration
from testbed.trial_shape import check_cross_traffic

DEFAULT_SIZES_BYTES = (16 * 1024, 256 * 1024, 1024**2, 4 * 1024**2, 16 * 1024**2)
MAX_SIZE_BYTES = 1024**3
MAX_REPS = 1000


def check_settings(
    sizes_bytes: Sequence[int], reps: int, timeout_s: float, *, sizes_flag: str = "--sizes", reps_flag: str = "--reps",
    probe_s: float = DEFAULT_PROBE_S, probe_flag: str = "--probe-s",
) -> None:
    """Errors name the flags (`testbed calibrate`'s by default; a caller with other flag names passes its own)."""
    if len(set(sizes_bytes)) < 2:
        raise InputError(f"{sizes_flag} {','.join(map(str, sizes_bytes))}: give at least 2 distinct message sizes")
    bad = [s for s in sizes_bytes if not 1024 <= s <= MAX_SIZE_BYTES]
    if bad:
        raise InputError(f"{sizes_flag}: {bad[0]} bytes is outside 1 KB..1 GB")
    if not 1 <= reps <= MAX_REPS:
        raise InputError(f"{reps_flag} {reps}: expected an integer in [1, {MAX_REPS}]")
    if not (timeout_s > 0 and timeout_s < float("inf")):
        raise InputError(f"--timeout {timeout_s:g}: expected a positive number of seconds")
    if not 0 < probe_s <= MAX_PROBE_S:
        raise InputError(f"{probe_flag} {probe_s:g}: expected seconds in (0, {MAX_PROBE_S:g}]")


def run_calibration(
    cluster,
    out_dir: str | Path,
    *,
    shape: LinkShape | None = None,
    unshaped: bool = False,
    world_size: int | None = None,
    backend: str = "auto",
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    reps: int = 5,
    warmup: int = 1,
    timeout_s: float = 600.0,
    figure: bool = True,
    on_phase: Callable[[str], None] | None = None,
    cross_traffic: int = 0,
    probe_s: float = DEFAULT_PROBE_S,
) -> tuple[Calibration, Path]:
    """Measure, fit and store; returns the calibration and the JSON's path (the figure is beside it, .png).
    `shape` None measures at the cluster's current shaping, or with every link unshaped when `unshaped`.
    `cross_traffic` N: N bulk TCP flows share the links while it measures (recorded; the predictions of trials with
    N flows use it, the others never). `probe_s`: seconds of training steps per contention measurement."""
    from testbed.launch import TrialFailed, end_trial, make_plan, watch_ranks

    check_settings(sizes_bytes, reps, timeout_s, probe_s=probe_s)
    check_cross_traffic(cross_traffic)
    if cross_traffic and len(cluster.hosts()) < 2:
        raise InputError(f"--cross-traffic {cross_traffic}: cross traffic needs at least 2 hosts")
    if unshaped and shape is not None:
        raise InputError("calibrate: a rate and unshaped exclude each other")
    say = on_phase or (lambda _msg: None)
    hosts = cluster.hosts()
    configured = cluster.recorded_shape()
    measured_shape = None if unshaped else (shape if shape is not None else configured)
    rate_bps = measured_shape.rate_bps if measured_shape is not None else None
    trial = Trial(
        compressor="syncsgd",
        rate_bps=rate_bps,
        world_size=world_size or 1,
        backend=backend,
        cluster=cluster.name,
        model="mlp",
    )
    trial = launch_plan.resolve(trial, hosts, world_size_given=world_size is not None)
    if trial.world_size < 2:
        raise InputError(f"calibrate needs at least 2 ranks; cluster {cluster.name!r} gives {trial.world_size}")
    out_dir = Path(out_dir)
    work = Path(tempfile.mkdtemp(prefix="testbed-calibrate-"))
    (work / "logs").mkdir()
    run_id = f"calibrate-{random.randrange(16**8):08x}"
    rank_out = cluster.rank_out_dir(work, run_id)
    plan = make_plan(cluster, trial, rank_out, timeout_s=timeout_s)  # the trials' placement and environment
    used = list(plan.hosts)
    procs: list = []
    cross: list = []
    keep_logs = False  # the working folder is kept only for an error that names the logs in it
    # what the next command on the cluster needs to end this calibration's ranks and restore the shaping after a
    # SIGKILL of this process (testbed.cluster_lease)
    _, remember = registry.note_work(cluster, hosts, configured, what=f"calibration {run_id}")
    try:
        if shape is not None:
            say(f"shaping at {shape.describe()}")
            cluster.apply_shaping(shape, hosts)
        elif unshaped and configured is not None:
            say("clearing the shaping")
            cluster.clear_shaping(hosts)

        if cross_traffic:
            say(f"starting {cross_traffic} cross-traffic flow{'s' * (cross_traffic != 1)}")
            cross = cross_flows.start(cluster, used, cross_traffic, duration_s=timeout_s + 60, log_dir=work / "logs",
                                      on_start=remember)  # fmt: skip
        say(f"all-reduce and all-gather on {trial.world_size} ranks ({plan.backend}), {len(sizes_bytes)} sizes")

        starts = []
        for r in plan.ranks:
            args = CollBenchArgs(
                out=str(rank_out / "collbench.json"),
                sizes_bytes=tuple(int(s) for s in sizes_bytes),
                reps=reps,
                warmup=warmup,
                backend=plan.backend,
                iface=r.host.data_iface,
                timeout_s=max(30.0, min(timeout_s, 300.0)),
                threads=cluster.threads_per_rank(trial.world_size),
                probe_s=probe_s,
            )
            starts.append(ranks.Rank(r.host, [sys.executable, "-m", "runners.collbench", *args.to_argv()], r.env,
                                     work / "logs" / r.log_name))  # fmt: skip
        ranks.start(cluster, starts, into=procs, on_start=remember)
        try:
            watch_ranks(procs, deadline=time.monotonic() + timeout_s, out_dir=work)
        except TrialFailed as e:
            if e.status == "interrupted":  # a signal: the caller says so and exits 128 + its number
                raise
            keep_logs = True
            raise LaunchError(f"calibration failed: {e}") from None
        cluster.fetch(used[0], rank_out, work)
        try:
            bench = json.loads((work / "collbench.json").read_text())
        except FileNotFoundError:
            keep_logs = True
            raise LaunchError(f"calibration: rank 0 wrote no results (logs in {work / 'logs'})") from None
    finally:
        try:
            problems = cross_flows.stop(cross) + end_trial(cluster, procs, configured, hosts, say,
                                                           restore=shape is not None or
                                                           (unshaped and configured is not None))  # fmt: skip
        finally:
            registry.clear_trial(cluster.name)
            if not keep_logs:  # kept only when the error names the logs there; an interrupt leaves nothing
                shutil.rmtree(work, ignore_errors=True)
        if problems and sys.exc_info()[0] is None:  # never hide the error that ended the calibration
            raise LaunchError(f"calibration: cleaning up failed: {'; '.join(problems)}; `testbed down --name "
                              f"{cluster.name}` ends what is left")  # fmt: skip
    calibration = calibration_from_bench(bench, cluster=cluster.name, rate_bps=rate_bps, cross_traffic=cross_traffic)
    path = save_calibration(calibration, out_dir)
    if figure:
        from testbed.report.figures import plot_calibration

        plot_calibration(calibration, path.with_suffix(".png"))
    return load_calibration(path), path

