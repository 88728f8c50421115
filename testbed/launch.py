"""Run one trial on a cluster: shape and verify the links, start one rank per host, watch, collect, record.

Order of work for a trial (and what is undone on the way out, whatever happens):
  1. shape every link at the trial's rate (the cluster's configured shaping is put back afterwards);
  2. probe h0 -> h1 with iperf3 for a second and record the measured goodput;
  3. start rank r on host r in its own process group, with the torchrun environment and the data interface;
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
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import testbed
from shaping.plan import ideal_goodput_bps
from testbed.config import Trial
from testbed.errors import InputError, LaunchError, TestbedError
from testbed.results import ResultsStore

POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 8
STOP = threading.Event()  # set by a Ctrl-C handler: the running trial ends at its next poll, rolled back


def stop_on_ctrl_c() -> None:
    """First Ctrl-C: stop the running trial cleanly (ranks killed, shaping restored, row stored as interrupted).
    A second Ctrl-C interrupts at once."""

    def handler(signum, frame):
        STOP.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)


class TrialFailed(LaunchError):
    def __init__(self, message: str, status: str = "failed"):
        super().__init__(message)
        self.status = status


def runner_argv(trial: Trial, out_dir: Path, iface: str, collective_timeout_s: float, threads: int = 0) -> list[str]:
    """The rank's command line: `python -m runners.train ...` with the trial's settings."""
    argv = [
        sys.executable,
        "-m",
        trial.runner,
        "--model",
        trial.model,
        "--batch-size",
        str(trial.batch_size),
        "--compressor",
        trial.compressor,
        "--iters",
        str(trial.iters),
        "--warmup-iters",
        str(trial.warmup_iters),
        "--seed",
        str(trial.seed),
        "--image-size",
        str(trial.image_size),
        "--seq-len",
        str(trial.seq_len),
        "--bucket-cap-mb",
        f"{trial.bucket_cap_mb:g}",
        "--iface",
        iface,
        "--out",
        str(out_dir),
        "--timeout-s",
        f"{collective_timeout_s:g}",
        "--backend",
        "gloo",
        "--threads",
        str(threads),
    ]
    if trial.serial:
        argv.append("--serial")
    for key, value in trial.options:
        argv += ["--opt", f"{key}={value}"]
    return argv


def rank_env(trial: Trial, rank: int, master_addr: str, master_port: int, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(trial.world_size),
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        PYTHONUNBUFFERED="1",
    )
    if threads:  # local hosts share this machine's cores; lab hosts keep their own defaults
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(line.strip() for line in lines[-n:]) or "(empty log)"


def run_trial(
    cluster,
    trial: Trial,
    store: ResultsStore,
    *,
    timeout_s: float = 600.0,
    probe: bool = True,
    on_phase: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run `trial` on `cluster`, append its row to `store` (also when it fails) and return the row."""
    hosts = cluster.hosts()
    if trial.world_size > len(hosts):
        raise InputError(
            f"--world-size {trial.world_size} is larger than cluster {cluster.name!r} ({len(hosts)} hosts); "
            f"use `testbed up --hosts {trial.world_size} --recreate` or a smaller world size"
        )
    store.ensure()
    say = on_phase or (lambda _msg: None)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    row = base_row(cluster, trial, started)
    out_dir = store.trial_dir(trial.trial_id)
    shutil.rmtree(out_dir, ignore_errors=True)
    (out_dir / "logs").mkdir(parents=True)
    used = hosts[: trial.world_size]
    configured = cluster.recorded_shape()
    # where the ranks write: the results directory itself on emulated hosts, a per-trial folder on lab hosts
    rank_out = cluster.rank_out_dir(out_dir, trial.trial_id)
    procs = []
    try:
        say("shaping")
        if trial.shape is not None:
            cluster.apply_shaping(trial.shape, hosts)
        else:
            cluster.clear_shaping(hosts)
        if probe and len(used) >= 2:
            from testbed.probe import probe_pair

            say("probing")
            result = probe_pair(cluster, used[0], used[1], requested_bps=trial.rate_bps, duration_s=1.0)
            row["measured_goodput_bps"] = result.achieved_bps
        say("starting ranks")
        port = random.randint(20000, 29999)
        threads = max(1, (os.cpu_count() or 1) // trial.world_size) if cluster.backend == "local" else 0
        collective_timeout_s = max(30.0, min(timeout_s, 300.0))
        for rank, host in enumerate(used):
            env = rank_env(trial, rank, used[0].address, port, threads)
            argv = runner_argv(trial, rank_out, host.data_iface, collective_timeout_s, threads)
            procs.append(cluster.start(host, argv, env=env, log_path=out_dir / "logs" / f"rank{rank}.log"))
        say("training")
        _watch(procs, deadline=time.monotonic() + timeout_s, out_dir=out_dir)
        for host in used:
            cluster.fetch(host, rank_out, out_dir)
        row.update(metrics_from_summary(out_dir / "summary.json"))
        row["status"] = "ok"
    except TrialFailed as e:
        row["status"], row["error"] = e.status, str(e)
    except TestbedError as e:
        row["status"], row["error"] = "failed", str(e)
    except KeyboardInterrupt:
        row["status"], row["error"] = "failed", "interrupted (Ctrl-C); a resumed sweep runs it again"
        raise
    finally:
        for p in procs:
            p.kill_group()
        say("restoring shaping")
        try:
            if configured is not None:
                cluster.apply_shaping(configured, hosts)
            else:
                cluster.clear_shaping(hosts)
        finally:
            row["wall_s"] = time.monotonic() - t0
            store.append(row)  # also on Ctrl-C: the trial is recorded as what it was when stopped
    return row


def _watch(procs: list, *, deadline: float, out_dir: Path) -> None:
    while True:
        if STOP.is_set():
            raise TrialFailed("interrupted (Ctrl-C); a resumed sweep runs it again")
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                raise TrialFailed(
                    f"rank {rank} on {procs[rank].host.name} exited with code {code}: "
                    f"{_tail(out_dir / 'logs' / f'rank{rank}.log')}"
                )
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            waiting = [r for r, c in enumerate(codes) if c is None]
            raise TrialFailed(
                f"trial timed out; ranks {waiting} still running. rank {waiting[0]} log: "
                f"{_tail(out_dir / 'logs' / f'rank{waiting[0]}.log')}",
                status="timeout",
            )
        time.sleep(POLL_INTERVAL_S)  # poll interval of the watch loop, bounded by the deadline


def base_row(cluster, trial: Trial, started: dt.datetime) -> dict[str, Any]:
    shape = trial.shape
    return {
        "trial_id": trial.trial_id,
        "status": "failed",
        "error": None,
        "started_at": started.isoformat(timespec="seconds"),
        "backend": cluster.backend,
        "cluster_name": cluster.name,
        "host_count": len(cluster.hosts()),
        "world_size": trial.world_size,
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
        "bucket_cap_mb": trial.bucket_cap_mb,
        "python_version": platform.python_version(),
        "kernel": platform.release(),
        "testbed_version": testbed.__version__,
        "hostname": platform.node(),
    }


METRICS = (
    "iter_time_s_mean",
    "iter_time_s_p5",
    "iter_time_s_p50",
    "iter_time_s_p95",
    "samples_per_s",
    "forward_s",
    "backward_s",
    "encode_s",
    "comm_s",
    "decode_s",
    "optimizer_s",
    "payload_bytes_per_iter",
    "wire_tx_bytes_per_iter",
    "wire_rx_bytes_per_iter",
)


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
    out.update(
        torch_version=env.get("torch_version"),
        dist_backend=env.get("backend"),
        device=env.get("device"),
        warmup_iters=summary.get("warmup_iters_used", summary.get("config", {}).get("warmup_iters")),
    )
    return out
