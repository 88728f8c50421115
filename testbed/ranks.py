"""One way to start ranks: start these argv on these hosts, each in a process group of its own, watch them, end them.

Every caller that runs ranks goes through here: a trial (testbed/launch.py), a calibration's collective benchmark
(testbed/calibrate.py), a co-located profile (testbed/modelling.py), the conformance and convergence checks
(testbed/conformance.py, testbed/convergence_check.py) and the benches that start their own ranks. What a rank is
told comes from runners/contract.py (`RankArgs`, `CollBenchArgs`, `ProfileArgs`, `ConformanceArgs`); where it runs
comes from a `Starter`: a cluster (`Cluster.start`: emulated hosts, lab hosts over SSH, Slurm steps) or
`THIS_MACHINE` (loopback ranks of this machine outside any cluster, started the way local ranks are: `python -P`,
a fixed working directory, a session of its own).

  start(starter, ranks, into=procs, on_start=...)   start each rank; each process is appended to `procs` as soon as
                                                    it runs (so whatever ends the caller's work ends it too)
  watch(procs, deadline=..., stop=...)              poll until every rank exited 0, the first one failed (fail fast),
                                                    `stop` was set (a signal) or the deadline passed: a `Watched`
  end(procs)                                        end every process group still there; the problems, in words
  running(starter, ranks)                           start; yield the processes; end them on the way out, however left
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from testbed.cluster.base import Host, RankProcess

POLL_INTERVAL_S = 0.05


@dataclasses.dataclass(frozen=True)
class Rank:
    """One process to start: where, its argv (argv[0] a Python means the host's), environment, log, working dir."""

    host: Host
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    workdir: Path | None = None


class Starter(Protocol):
    """What starts a process on a host in a process group of its own: every `Cluster`, and `THIS_MACHINE`."""

    def start(
        self, host: Host, argv: list[str], *, env: dict[str, str], log_path: Path, workdir: Path | None = None
    ) -> RankProcess: ...


class LoopbackProcess(RankProcess):
    """A process of this machine in a session (and process group) of its own."""

    def __init__(self, host: Host, popen: subprocess.Popen, log_path: Path, grace_s: float = 0.0):
        self.host, self.popen, self.log_path, self.grace_s = host, popen, log_path, grace_s

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.popen.wait(timeout_s)

    def kill_group(self, grace_s: float | None = None) -> None:
        """SIGKILL the group (SIGTERM first while the leader runs when `grace_s` > 0, waiting that long; default the
        starter's), and reap. The group is killed also when its leader already ended: children may live on."""
        grace_s = self.grace_s if grace_s is None else grace_s
        if grace_s > 0 and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


class ThisMachine:
    """Starts processes on this machine outside any cluster (the loopback checks): a Python argv runs with `-P` (the
    working directory and a script's folder are not on sys.path: a `runners/` or `json.py` planted where the user
    stands is never imported, as root), in the working directory given (else the log's folder), in a session of its
    own, stdout and stderr to the log. The environment is the caller's, whole: an allowlist where it matters.
    `grace_s`: how long an ended process gets between SIGTERM and SIGKILL (0: SIGKILL at once)."""

    host = Host(name="localhost", address="127.0.0.1", data_iface="lo")

    def __init__(self, grace_s: float = 0.0):
        self.grace_s = grace_s

    def start(
        self, host: Host, argv: list[str], *, env: dict[str, str], log_path: Path, workdir: Path | None = None
    ) -> LoopbackProcess:
        argv = list(argv)
        if argv and os.path.basename(argv[0]).startswith("python") and argv[1:2] not in (["-P"], ["-I"]):
            argv = [argv[0], "-P", *argv[1:]]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, env=dict(env), cwd=workdir or log_path.parent.absolute(), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        return LoopbackProcess(host, popen, log_path, self.grace_s)


THIS_MACHINE = ThisMachine()


def start(
    starter: Starter,
    ranks: Sequence[Rank],
    *,
    into: list[RankProcess],
    on_start: Callable[[RankProcess], None] | None = None,
    stop: threading.Event | None = None,
) -> bool:
    """Start each rank in order, appending its process to `into` as soon as it runs and calling `on_start` with it
    (to note its handle for whoever finishes this work after a SIGKILL). False when `stop` was set before all
    started (the caller ends what runs)."""
    for r in ranks:
        if stop is not None and stop.is_set():
            return False
        into.append(starter.start(r.host, list(r.argv), env=dict(r.env), log_path=r.log_path, workdir=r.workdir))
        if on_start is not None:
            on_start(into[-1])
    return True


@dataclasses.dataclass(frozen=True)
class Watched:
    """How watching ended: every exit code (None: still running), the first rank that exited non-zero, or the
    deadline, or a stop."""

    codes: tuple[int | None, ...]
    failed: int | None = None  # index of the first rank that exited non-zero
    timed_out: bool = False
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    @property
    def running(self) -> list[int]:
        return [r for r, c in enumerate(self.codes) if c is None]


def watch(
    procs: Sequence[RankProcess],
    *,
    deadline: float,
    stop: threading.Event | None = None,
    poll_s: float = POLL_INTERVAL_S,
) -> Watched:
    """Poll until every process exited 0, one exited non-zero (the first such rank: fail fast, the others are left
    to the caller to end), `stop` is set, or time.monotonic() passes `deadline`."""
    codes: tuple[int | None, ...] = tuple(None for _ in procs)
    while True:
        if stop is not None and stop.is_set():
            return Watched(codes, stopped=True)
        codes = tuple(p.poll() for p in procs)
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return Watched(codes, failed=rank)
        if all(code == 0 for code in codes):
            return Watched(codes)
        if time.monotonic() > deadline:
            return Watched(codes, timed_out=True)
        time.sleep(poll_s)  # the poll interval of the watch loop, bounded by the deadline


def settle(procs: Sequence[RankProcess], grace_s: float, poll_s: float = POLL_INTERVAL_S) -> tuple[int | None, ...]:
    """Give the others of a failed rank up to `grace_s` to end too (their logs say what they saw); their codes."""
    until = time.monotonic() + grace_s
    while time.monotonic() < until and any(p.poll() is None for p in procs):
        time.sleep(poll_s)  # poll interval, bounded by the grace period
    return tuple(p.poll() for p in procs)


def end(procs: Sequence[RankProcess]) -> list[str]:
    """End every process group (SIGTERM, then SIGKILL; each backend's own way) and reap; each is tried even when one
    before it failed (an SSH connection down). Returns what failed, in words."""
    problems = []
    for p in procs:
        try:
            p.kill_group()
        except Exception as e:  # noqa: BLE001 - the other kills, the restore and the row must still happen
            problems.append(f"ending {p.host.name}'s process {getattr(p, 'pid', '?')} failed ({e})")
    return problems


@contextlib.contextmanager
def running(starter: Starter, ranks: Sequence[Rank], **start_kw: Any) -> Iterator[list[RankProcess]]:
    """Start the ranks and yield their processes; every process group is ended on the way out, however it is left."""
    procs: list[RankProcess] = []
    try:
        start(starter, ranks, into=procs, **start_kw)
        yield procs
    finally:
        end(procs)
