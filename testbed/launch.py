"""Run one trial on a cluster: shape and verify the links, start the ranks, watch, collect, record.

Order of work for a trial (and what is undone on the way out, whatever happens):
  1. shape every link at the trial's rate (the cluster's configured shaping is put back afterwards), start the
     cross traffic and, with it, ping h0 -> h1 for the loaded RTT (testbed.cross_traffic);
  2. probe h0 -> h1 with iperf3 for a second and record the measured goodput;
  3. start every rank of the launch plan (testbed.launch_plan: ranks per host, devices, allowlisted environment) in
     its own process group;
  4. poll the ranks: the first one to exit non-zero fails the trial at once (its last log lines become the error),
     the others' process groups are killed; past the deadline the trial is a timeout;
  5. read rank 0's summary.json and turn it into one results row.
The launcher knows nothing of tc (it calls the cluster) and nothing of torch (it reads the runner's JSON).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import testbed
from runners.contract import SUMMARY_ACCURACY, SUMMARY_ENV_KEYS, SUMMARY_METRICS
from shaping.plan import ideal_goodput_bps
from testbed import cross_traffic, launch_plan, ranks, trial_shape
from testbed.cluster import registry
from testbed.config import Trial
from testbed.errors import LaunchError, TestbedError
from testbed.results import ResultsStore

METRICS = SUMMARY_METRICS  # the summary keys copied into each results row

LOG_TAIL_LINES = 8
STOP = threading.Event()  # set by a signal handler: the running trial ends at its next poll, rolled back
STOPPED_BY: list[str] = []  # the name of the signal that set STOP (SIGINT shows as Ctrl-C)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_label(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def stop_on_signals() -> None:
    """First Ctrl-C, SIGTERM or SIGHUP (a closed SSH session, a Slurm time limit, a CI cancel): stop the running
    trial cleanly (ranks killed, shaping restored, row stored as interrupted). A second one interrupts at once."""

    _MAIN_PID[:] = [os.getpid()]

    def handler(signum, frame):
        if _in_forked_child(signum):
            return
        STOPPED_BY.append(signal_label(signum))
        STOP.set()
        for s in STOP_SIGNALS:
            signal.signal(s, _interrupt_now)

    for s in STOP_SIGNALS:
        signal.signal(s, handler)


stop_on_ctrl_c = stop_on_signals  # the old name


def _interrupt_now(signum, frame):
    if not _in_forked_child(signum):
        raise KeyboardInterrupt


_MAIN_PID: list[int] = []


def _in_forked_child(signum: int) -> bool:
    """A child forked by a library inherits these handlers (pyroute2 forks a helper per namespace and ends it with
    SIGTERM): there the signal must just end the child, never run the controller's stop or rollback."""
    if not _MAIN_PID or os.getpid() == _MAIN_PID[0]:
        return False
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return True


def stop_exit_code() -> int:
    """The exit status of a command stopped by a signal: 128 + its number (Ctrl-C 130, SIGTERM 143, SIGHUP 129)."""
    name = STOPPED_BY[0] if STOPPED_BY else "Ctrl-C"
    return 128 + (signal.SIGINT if name == "Ctrl-C" else signal.Signals[name])


def _stop_message() -> str:
    return f"interrupted ({STOPPED_BY[0] if STOPPED_BY else 'Ctrl-C'}); rerunning the same command measures it again"


class TrialFailed(LaunchError):
    def __init__(self, message: str, status: str = "failed"):
        super().__init__(message)
        self.status = status


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(line.strip() for line in lines[-n:]) or "(empty log)"


def make_plan(cluster, trial: Trial, out_dir, *, timeout_s: float, user_env=()) -> launch_plan.LaunchPlan:
    """The launch plan of a resolved trial on this cluster (what `run --dry-run` prints and `run_trial` starts)."""
    hosts = cluster.hosts()
    return launch_plan.plan(
        trial,
        hosts,
        out_dir=out_dir,
        master_port=random.randint(20000, 29999),
        collective_timeout_s=max(30.0, min(timeout_s, 300.0)),
        threads=cluster.threads_per_rank(trial.world_size),
        cluster_name=cluster.name,
        controller_env=os.environ,
        user_env=user_env,
    )


def run_trial(
    cluster,
    trial: Trial,
    store: ResultsStore,
    *,
    timeout_s: float = 600.0,
    probe: bool = True,
    on_phase: Callable[[str], None] | None = None,
    user_env: tuple[tuple[str, str], ...] = (),
    probe_duration_s: float = 1.0,
    probe_streams: int = 1,
    plugin: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `trial` on `cluster`, append its row to `store` (also when it fails) and return the row.
    `trial` may still say backend auto / ranks_per_host None: it is resolved against the cluster's hosts here.
    `plugin`: what testbed.plugins.inspect said of the trial's plugin compressor (recorded in the row)."""
    hosts = cluster.hosts()
    (trial,) = launch_plan.resolve_on(cluster, [trial], hosts=hosts)
    store.ensure()
    say = on_phase or (lambda _msg: None)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    out_dir = store.trial_dir(trial.trial_id)
    # where the ranks write: the results directory itself on emulated hosts, a per-trial folder on lab hosts
    rank_out = cluster.rank_out_dir(out_dir, trial.trial_id)
    plan = make_plan(cluster, trial, rank_out, timeout_s=timeout_s, user_env=user_env)
    row = base_row(cluster, trial, started, plan)
    row.update(trial_shape.row_fields(cluster, trial),
               cross_traffic_pairs=cross_traffic.describe(list(plan.hosts), trial.cross_traffic) or None)
    if plugin is not None:
        from testbed.plugins import row_fields

        row.update(row_fields(plugin, trial.plugin_path))
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    attempt = store.reserved_attempt(trial.trial_id)
    used = list(plan.hosts)
    configured = cluster.recorded_shape()
    procs, cross = [], []
    # what the next command on this cluster needs to finish the trial if this process is killed (SIGKILL); remember:
    # a rank or an iperf3 server, found again by its handle
    note, remember = registry.note_work(cluster, hosts, configured, row=row, out=str(store.root), attempt=attempt)
    try:
        say("shaping")
        if STOP.is_set():
            raise TrialFailed(_stop_message(), status="interrupted")
        trial_shape.apply(cluster, trial, hosts)  # the trial's rate, each --host-bw host at its own
        cross = cross_traffic.start(cluster, used, trial.cross_traffic, duration_s=timeout_s + 60,
                                    log_dir=out_dir / "logs", on_start=remember)  # fmt: skip
        row["wall_shape_s"] = lap = time.monotonic() - t0  # where the trial's time goes (docs/results-format.md)
        if cross:  # what a ring step waits behind the flows' standing queue (an observation in the row)
            say("measuring the loaded RTT")
            row["loaded_rtt_s"] = cross_traffic.loaded_rtt_s(cluster, used[0], used[1])
        if probe and len(used) >= 2:
            from testbed.probe import probe_pair

            say("probing")
            result = probe_pair(cluster, used[0], used[1], requested_bps=trial.rate_bps, burst_bytes=trial.burst_bytes,
                                duration_s=probe_duration_s, streams=probe_streams, on_start=remember)  # fmt: skip
            row["measured_goodput_bps"] = result.achieved_bps
            row["probe_duration_s"], row["probe_streams"] = probe_duration_s, probe_streams
            registry.record_trial(cluster.name, note)
        row["wall_probe_s"], lap = time.monotonic() - t0 - lap, time.monotonic() - t0
        say("starting ranks")
        starts = [ranks.Rank(r.host, [sys.executable, *r.argv], r.env, out_dir / "logs" / r.log_name) for r in plan.ranks]
        if not ranks.start(cluster, starts, into=procs, on_start=remember, stop=STOP):
            raise TrialFailed(_stop_message(), status="interrupted")
        say("training")
        watch_ranks(procs, deadline=time.monotonic() + timeout_s, out_dir=out_dir)
        row["wall_ranks_s"] = time.monotonic() - t0 - lap  # the ranks' start to their exit
        for host in used:
            cluster.fetch(host, rank_out, out_dir)
        row.update(metrics_from_summary(out_dir / "summary.json"))
        row["status"] = "ok"
    except TrialFailed as e:
        row["status"], row["error"] = e.status, str(e)
    except TestbedError as e:
        row["status"], row["error"] = "failed", str(e)
    except KeyboardInterrupt:
        row["status"], row["error"] = "interrupted", _stop_message()
        raise
    finally:
        problems = cross_traffic.stop(cross) + end_trial(cluster, procs, configured, hosts, say)
        if problems:
            row["error"] = "; ".join([row["error"] or "", *problems]).lstrip("; ")
        row["wall_s"] = time.monotonic() - t0
        if row.get("wall_ranks_s") is not None:  # fetching the records, ending the ranks, restoring the shaping
            row["wall_teardown_s"] = row["wall_s"] - row["wall_shape_s"] - row["wall_probe_s"] - row["wall_ranks_s"]
        try:
            store_row(store, row, attempt)
        finally:
            registry.clear_trial(cluster.name)  # stored, or kept in the trial directory: nothing left to finish
        if problems:
            raise LaunchError(f"trial {trial.trial_id} stored as {row['status']}, but cleaning up failed: "
                              f"{'; '.join(problems)}; `testbed down --name {cluster.name}` ends what is left")  # fmt: skip
    return row


def end_trial(
    cluster, procs: list, configured, hosts, say: Callable[[str], None], *, restore: bool = True
) -> list[str]:
    """Kill every process of the trial and (with `restore`) put the cluster's shaping back; each step runs even when
    one before it failed (an SSH connection down, an squeue error). Returns what failed, in words."""
    problems = ranks.end(procs)
    if not restore:
        return problems
    say("restoring shaping")
    try:
        if configured is not None:
            cluster.apply_shaping(configured, hosts)
        else:
            cluster.clear_shaping(hosts)
    except Exception as e:  # noqa: BLE001 - the row must still be stored
        problems.append(f"restoring the shaping failed ({e})")
    return problems


class RowNotStored(TestbedError):
    """The results store could not take a trial's row (full or read-only); the row is kept beside its records."""


def store_row(store: ResultsStore, row: dict[str, Any], attempt: int | None) -> None:
    """Store the row (also on Ctrl-C: the trial is recorded as what it was when stopped). A full or unwritable results
    directory keeps the row as JSON in the trial's directory and says which command stores it later."""
    try:
        store.append(row, attempt=attempt)
        return
    except (OSError, TestbedError) as e:
        reason = getattr(e, "strerror", None) or str(e)
    try:
        kept = store.keep_pending(row, attempt or 1)
    except OSError as e2:
        raise RowNotStored(
            f"could not store the row of trial {row['trial_id']} in {store.rows_dir} ({reason}) nor keep it in its "
            f"trial directory ({e2.strerror}); its ranks' records stay in {store.attempt_dir(row['trial_id'], attempt or 1)}"
        ) from None
    raise RowNotStored(
        f"could not store the row of trial {row['trial_id']} ({row['status']}) in {store.rows_dir} ({reason}); it is "
        f"kept in {kept} with the trial's records: free space or fix the directory, then run "
        f"`testbed results {store.root} --store-pending`"
    )


def watch_ranks(procs: list, *, deadline: float, out_dir: Path) -> None:
    """Watch rank processes (testbed.ranks.watch) until all exit 0; the first non-zero exit (its log tail), Ctrl-C
    or the deadline raise TrialFailed. Logs are read from out_dir/logs/rank<r>.log."""
    watched = ranks.watch(procs, deadline=deadline, stop=STOP)
    if watched.stopped:
        raise TrialFailed(_stop_message(), status="interrupted")
    if watched.failed is not None:
        rank = watched.failed
        raise TrialFailed(
            f"rank {rank} on {procs[rank].host.name} exited with code {watched.codes[rank]}: "
            f"{_tail(out_dir / 'logs' / f'rank{rank}.log')}"
        )
    if watched.timed_out:
        waiting = watched.running
        raise TrialFailed(
            f"trial timed out; ranks {waiting} still running. rank {waiting[0]} log: "
            f"{_tail(out_dir / 'logs' / f'rank{waiting[0]}.log')}",
            status="timeout",
        )


def base_row(cluster, trial: Trial, started: dt.datetime, plan: launch_plan.LaunchPlan) -> dict[str, Any]:
    shape = trial.shape
    return {
        "trial_id": trial.trial_id,
        "status": "failed",
        "error": None,
        "started_at": started.isoformat(timespec="seconds"),
        "backend": cluster.backend,
        "cluster_name": cluster.name,
        "host_count": len(plan.hosts),
        "ranks_per_host": plan.ranks_per_host,
        "world_size": trial.world_size,
        "dist_backend": trial.backend,
        "intra_host": trial.intra_host,
        "nccl_settings": json.dumps(plan.nccl_settings(), sort_keys=True),
        "user_env_keys": ",".join(plan.user_env_keys),
        "rate_bps": trial.rate_bps or 0,
        "burst_bytes": shape.effective_burst_bytes if shape else None,
        "qdisc": shape.qdisc if shape else None,
        "delay_s": trial.delay_s,
        "ideal_goodput_bps": ideal_goodput_bps(trial.rate_bps) if trial.rate_bps else None,
        "model": trial.model,
        "batch_size": trial.batch_size,
        "image_size": trial.image_size,
        "seq_len": trial.seq_len,
        "compressor": trial.compressor,
        "compressor_options": json.dumps(trial.option_dict, sort_keys=True),
        "iters": trial.iters,
        "warmup_iters": trial.warmup_iters,
        "seed": trial.seed,
        "serial": trial.serial,
        "overlap": trial.overlap,
        "skew_probe": trial.skew_probe,
        "timeline_iters": trial.timeline_iters,
        "trace_iters": trial.trace_iters,
        "bucket_cap_mb": trial.bucket_cap_mb,
        "data": trial.data,
        "eval_every": trial.eval_every,
        "target_accuracy": trial.target_accuracy,
        "max_steps": trial.max_steps,
        "lr": trial.lr,
        "python_version": platform.python_version(),
        "kernel": platform.release(),
        "testbed_version": testbed.__version__,
        "hostname": platform.node(),
        **colocation_fields(cluster, trial),
    }


def colocation_fields(cluster, trial: Trial) -> dict[str, Any]:
    """Whether the trial's ranks share cores (schema 5, issue 32): on emulated hosts every rank runs on this
    machine, "N ranks share M cores" when ranks x threads exceed its cores; unknown (null) on lab hosts."""
    if cluster.backend != "local":
        return {"cores": None, "threads_per_rank": None, "colocation": None}
    cores, threads = os.cpu_count() or 1, cluster.threads_per_rank(trial.world_size)
    shared = trial.world_size * max(1, threads) > cores
    return {"cores": cores, "threads_per_rank": threads,
            "colocation": f"{trial.world_size} ranks share {cores} cores" if shared else None}  # fmt: skip


def metrics_from_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrialFailed(f"all ranks exited 0 but rank 0 wrote no {path.name}") from None
    missing = [m for m in METRICS if m not in summary]
    if missing:
        raise TrialFailed(f"{path} lacks {', '.join(missing)}; the runner and the launcher disagree on the format")
    env = summary.get("env", {})
    out = {m: summary[m] for m in METRICS}
    out.update({k: env.get(k) for k in SUMMARY_ENV_KEYS if k != "backend"})
    out["dist_backend"] = env.get("backend")
    out["warmup_iters"] = summary.get("warmup_iters_used", summary.get("config", {}).get("warmup_iters"))
    out["settle_ratio"] = summary.get("settle_ratio")  # not in a summary of an older runner
    out.update(summary.get("wall_split_s") or {}, model_sync=summary.get("model_sync"))  # rank 0's time split
    # learning (issue 33): absent from an older runner's summary; the curve is stored as JSON text
    out.update({k: summary[k] for k in SUMMARY_ACCURACY if summary.get(k) is not None})
    if out.get("curve") is not None:
        out["curve"] = json.dumps(out["curve"])
    return out
