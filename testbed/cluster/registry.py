"""Which clusters exist: one JSON record per cluster name under the state directory, and a lock per name.

The state lives in /run/testbed by default (tmpfs: it vanishes on reboot together with the namespaces it
describes); `TESTBED_STATE_DIR` moves it (tests use a private one). `backends.open_cluster(name)` returns the backend
object for a recorded cluster; this module knows no backend.

The lease: every command that changes a cluster's links or runs trials on it (run, sweep, calibrate, probe, shape,
down) holds the cluster's lease while it works, so two commands never shape or measure one cluster at once. It is an
flock on `leases/<name>.lease` (opened with O_NOFOLLOW in a 0700 directory), plus `leases/<name>.holder.json` naming
the holder (pid, command line, start time) for the message a refused command prints. The kernel releases an flock
when its holder dies (also on SIGKILL), so a dead holder never blocks anyone; `leases/<name>.trial.json` is what a
trial in flight left behind (its processes, results directory, row, the shaping before): whoever takes the lease next
and finds it finishes that trial (testbed.cluster_lease).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shaping.files import atomic_write
from testbed.errors import ClusterError, InputError

DEFAULT_CLUSTER = "tb"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")


def state_dir() -> Path:
    return Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise InputError(
            f"--name {name!r}: cluster names are 1-10 characters, a lowercase letter then lowercase letters or digits"
        )
    return name


def record_path(name: str) -> Path:
    return state_dir() / "clusters" / f"{check_name(name)}.json"


def load_record(name: str) -> dict[str, Any] | None:
    path = record_path(name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def save_record(name: str, record: dict[str, Any]) -> None:
    path = record_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=2, sort_keys=True))


def delete_record(name: str) -> None:
    record_path(name).unlink(missing_ok=True)


def recorded_names() -> list[str]:
    folder = state_dir() / "clusters"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Serialise changes to one cluster (two `up`s of the same name must not interleave)."""
    path = state_dir() / "locks" / f"{check_name(name)}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def note_building(name: str, namespaces: list[str]) -> None:
    """Before `up` creates a namespace: the names it is about to make (a SIGKILL between creating a namespace and
    marking it must not leave one that `down` takes for someone else's)."""
    path = state_dir() / "building" / f"{check_name(name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(namespaces))


def building(name: str) -> list[str]:
    """The namespaces an unfinished `up` of `name` was making ([] when none)."""
    try:
        return list(json.loads((state_dir() / "building" / f"{check_name(name)}.json").read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return []


def building_names() -> list[str]:
    folder = state_dir() / "building"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def clear_building(name: str) -> None:
    (state_dir() / "building" / f"{check_name(name)}.json").unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------- the lease
LEASE_POLL_S = 0.1  # how often a waiting command tries the lease again


class ClusterBusy(ClusterError):
    """The cluster's lease is held by another live command (nothing was changed)."""


def _lease_dir() -> Path:
    path = state_dir() / "leases"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise ClusterError(f"{path}: cannot keep the clusters' leases there ({e.strerror}); the state directory "
                           "($TESTBED_STATE_DIR, default /run/testbed) must be yours and writable") from None  # fmt: skip
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
        raise ClusterError(f"{path}: not a directory of this user's; the testbed keeps its leases there")
    return path


def lease_path(name: str, suffix: str) -> Path:
    return _lease_dir() / f"{check_name(name)}.{suffix}"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        with os.fdopen(fd) as fh:
            return json.load(fh)
    except ValueError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot, /proc/<pid>/stat field 22), or None when it is gone:
    with the pid it names one process for good (a pid reused later has another start time)."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def holder(name: str) -> dict[str, Any] | None:
    """Who holds (or last held) the cluster's lease: pid, command, started_at, start_ticks; None when unknown."""
    return _read_json(lease_path(name, "holder.json"))


def holder_alive(info: dict[str, Any] | None) -> bool:
    if not info or not isinstance(info.get("pid"), int):
        return False
    return process_start_ticks(info["pid"]) == info.get("start_ticks")


def describe_holder(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (it has not said which yet)"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("started_at", 0)))
    return f"pid {info.get('pid')} (`{info.get('command', '?')}`, since {since})"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def lease(name: str, *, wait_s: float = 0.0, force: bool = False, command: str | None = None) -> Iterator[None]:
    """Hold cluster `name`'s lease for the block. Held by another command: wait up to `wait_s` seconds for it, then
    raise ClusterBusy naming the holder. `force` (down --force) goes ahead without the lease only when the recorded
    holder is dead (a process that inherited the lock may keep it after its holder died); a live holder is refused
    whatever is asked."""
    path = lease_path(name, "lease")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:  # a symlink planted there (ELOOP), or no permission
        raise ClusterError(f"{path}: cannot open cluster {name!r}'s lease ({e.strerror}); it must be a plain file "
                           "of the testbed's (remove it if something else is there)") from None  # fmt: skip
    locked_here = False
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        while not (locked_here := _try_lock(fd)):
            info = holder(name)
            if force and info is not None and not holder_alive(info):
                break  # the holder is gone; whoever keeps the lock is not running a testbed command
            if time.monotonic() >= deadline:
                raise ClusterBusy(_busy_message(name, info, wait_s, force))
            time.sleep(LEASE_POLL_S)  # waiting for another command to finish, bounded by --wait
        me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()), "started_at": time.time(),
              "command": command or shlex.join(["testbed", *sys.argv[1:]])}  # fmt: skip
        atomic_write(lease_path(name, "holder.json"), json.dumps(me, sort_keys=True))
        try:
            yield
        finally:
            if (holder(name) or {}).get("pid") == os.getpid():
                lease_path(name, "holder.json").unlink(missing_ok=True)
    finally:
        if locked_here:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _busy_message(name: str, info: dict[str, Any] | None, wait_s: float, force: bool) -> str:
    waited = f"after waiting {wait_s:g} s" if wait_s > 0 else "now"
    if force:
        return (
            f"cluster {name!r} is in use by {describe_holder(info)}, which is alive; --force takes the lease only "
            "from a dead holder: stop that command first (Ctrl-C or kill PID), or wait with --wait SECONDS"
        )
    return (
        f"cluster {name!r} is in use by {describe_holder(info)} {waited}; wait for it with --wait SECONDS, "
        "or stop that command first"
    )


def lease_status(name: str) -> dict[str, Any] | None:
    """The live holder of the cluster's lease (for `status`), or None when it is free or cannot be read (a user
    without access to the state directory). Reads only: takes nothing."""
    try:
        info = holder(name)
    except (OSError, ClusterError):
        return None
    return info if holder_alive(info) else None


# ------------------------------------------------------------------------------------- the trial in flight
def record_trial(name: str, trial: dict[str, Any]) -> None:
    """Note the trial now running on the cluster (its processes, results directory, row, the shaping before), so
    whoever takes the lease after a SIGKILL of this command can finish it. Only the lease holder calls this."""
    me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())}
    atomic_write(lease_path(name, "trial.json"), json.dumps({**trial, "writer": me}, sort_keys=True, default=str))


def note_work(cluster, hosts, configured, **what: Any) -> tuple[dict[str, Any], Callable[[Any], None]]:
    """Note a command's work on `cluster` for whoever finishes it after a SIGKILL of this process (record_trial;
    cluster_lease.finish_dead_trial reads it): `what` (a trial's row, store and attempt, or a word of what it is), the
    `hosts` it uses, the shaping to put back (`configured`, the recorded one) and this process as holder.
    Returns the note (the caller may update it and record it again) and `remember(proc)`, which adds a started
    process's handle to it, so that the next command ends that process if it is still the same one."""
    note: dict[str, Any] = {**what, "hosts": [h.name for h in hosts], "processes": [],
                            "shape_before": configured.to_dict() if configured else None,
                            "holder": holder(cluster.name)}  # fmt: skip
    record_trial(cluster.name, note)

    def remember(proc) -> None:
        if (handle := proc.handle()) is not None:
            note["processes"].append(handle)
            record_trial(cluster.name, note)

    return note, remember


def trial_in_flight(name: str) -> dict[str, Any] | None:
    return _read_json(lease_path(name, "trial.json"))


def unfinished_trial(name: str) -> dict[str, Any] | None:
    """What `status` says of a trial whose command was killed (its writer gone): the pid, what it was, how many
    processes it noted; None when there is none or it cannot be read. Reads only."""
    try:
        note = trial_in_flight(name)
    except (OSError, ClusterError):
        return None
    if not note or holder_alive(note.get("writer")):
        return None
    what = f"trial {note['row'].get('trial_id')}" if isinstance(note.get("row"), dict) else note.get("what", "work")
    return {"pid": (note.get("writer") or {}).get("pid"), "what": what, "processes": len(note.get("processes") or [])}


def clear_trial(name: str) -> None:
    lease_path(name, "trial.json").unlink(missing_ok=True)
