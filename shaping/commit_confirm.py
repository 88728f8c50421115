"""Commit confirmed: a shaping change on a lab host undoes itself unless the controller confirms it in time.

Shaping the wrong NIC of a remote host (or shaping the right one to 10 kbit) can cut the controller off. Like a
router's ``commit confirmed``, every lab shaping change goes through here:

1. `snapshot()` reads the interface's shaping (egress root qdisc and ingress redirect) before the change.
2. The change is applied (`shaping.__main__`).
3. `arm()` writes a pending record (previous state, applied plan, deadline, a random token) to a state file and starts
   a detached timer process (own session, no terminal, stdio to a log) that survives the SSH session.
4. The controller opens a *new* SSH connection (proof it can still reach the host) and runs ``confirm``: the pending
   record is removed and the timer ended. If the deadline passes first, the timer restores the previous state and
   marks the record ``rolled_back``; a late ``confirm`` then fails loudly.

State lives in ``/run/testbed-shaping/<netns inode>/`` (tmpfs: a reboot drops shaping and records alike), so hosts that
share a filesystem but not a network namespace (the test fixture's namespaced hosts) never mix their records.
A lock file serialises apply/confirm/timer. ``TESTBED_SHAPING_STATE_DIR`` moves the base directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shaping import ingress, tc
from shaping.errors import InputError, ShapingError
from shaping.files import atomic_write
from shaping.plan import LinkShape

DEFAULT_BASE = "/run/testbed-shaping"
MAX_CONFIRM_WITHIN_S = 3600.0  # a dead-man timer that may wait longer than an hour is no protection
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def netns_id(netns: str | None = None) -> str:
    """A stable id of the network namespace the shaping happens in: the inode of its nsfs file."""
    path = f"/run/netns/{netns}" if netns else "/proc/self/ns/net"
    try:
        return f"netns-{os.stat(path).st_ino}"
    except OSError as e:
        raise InputError(f"network namespace {netns or '(current)'!r} not found: {e.strerror}") from None


def state_dir(netns: str | None = None, base: str | Path | None = None) -> Path:
    root = Path(base or os.environ.get("TESTBED_SHAPING_STATE_DIR", DEFAULT_BASE))
    return root / netns_id(netns)


def check_within(within_s: float) -> float:
    """The confirmation deadline: a finite number of seconds in (0, MAX_CONFIRM_WITHIN_S]; InputError otherwise."""
    if isinstance(within_s, bool) or not isinstance(within_s, int | float) or not 0 < within_s <= MAX_CONFIRM_WITHIN_S:
        raise InputError(
            f"--confirm-within {within_s}: expected seconds in (0, {MAX_CONFIRM_WITHIN_S:g}] "
            "(the timer must be able to fire)"
        )
    return float(within_s)


def _record_path(sdir: Path, dev: str) -> Path:
    return sdir / f"{dev}.pending.json"


@contextlib.contextmanager
def _locked(sdir: Path) -> Iterator[None]:
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(sdir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write(path: Path, record: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(record, indent=1))


def snapshot(dev: str, *, netns: str | None = None) -> dict[str, Any]:
    """Shaping of `dev` now, in the form `restore()` takes."""
    return {"egress": tc.show(dev, netns=netns), "ingress": ingress.show(dev, netns=netns)}


def restore(dev: str, previous: dict[str, Any], *, netns: str | None = None) -> None:
    """Put `dev` back to a snapshot: re-apply the testbed's previous shaping, or clear it (which also brings back a
    foreign root qdisc that a forced apply saved)."""
    egress = previous.get("egress") or {}
    if egress.get("owned") and egress.get("rate_bps"):
        tc.apply(dev, LinkShape.from_dict(egress, read_back=True), netns=netns, peers=tuple(egress.get("peers") or ()))
    else:
        tc.clear(dev, netns=netns)
    ing = previous.get("ingress") or {}
    shaped = ing.get("shaping") or {}
    if ing.get("active") and shaped.get("owned") and shaped.get("rate_bps"):
        ingress.apply(
            dev, LinkShape.from_dict(shaped, read_back=True), netns=netns, peers=tuple(ing.get("peers") or ())
        )
    else:
        ingress.clear(dev, netns=netns)


def _timer_alive(record: dict[str, Any]) -> bool:
    pid = record.get("timer_pid")
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return record["token"].encode() in cmdline


def _stop_timer(record: dict[str, Any]) -> None:
    """End the record's timer process, after checking /proc that the pid still is that timer (pid reuse)."""
    if _timer_alive(record):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record["timer_pid"], signal.SIGTERM)


def pending(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any] | None:
    return _read(_record_path(state_dir(netns, base), dev))


def arm(
    dev: str,
    previous: dict[str, Any],
    applied: dict[str, Any],
    within_s: float,
    *,
    netns: str | None = None,
    base: str | Path | None = None,
) -> dict[str, Any]:
    """Record a pending change of `dev` and start the timer that restores `previous` after `within_s` seconds.

    If a change is already pending, its `previous` (the last confirmed state) is kept and its timer replaced."""
    within_s = check_within(within_s)
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    with _locked(sdir):
        old = _read(path)
        if old is not None and old.get("status") == "pending":
            _stop_timer(old)
            previous = old["previous"]
        token = secrets.token_hex(8)
        deadline = time.time() + within_s
        record = {
            "dev": dev,
            "netns": netns,
            "status": "pending",
            "token": token,
            "armed_unix": time.time(),
            "deadline_unix": deadline,
            "previous": previous,
            "applied": applied,
            "timer_pid": None,
        }
        _write(path, record)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        log = open(sdir / f"{dev}.timer.log", "ab")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shaping.commit_confirm", "--timer", str(path), token],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session: the SSH session's hangup does not reach it
                close_fds=True,
                cwd="/",
                env=env,
            )
        finally:
            log.close()
        record["timer_pid"] = proc.pid
        _write(path, record)
    return {"armed": True, "within_s": within_s, "deadline_unix": deadline, "timer_pid": proc.pid, "token": token}


def confirm(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Keep the pending change of `dev`: remove the record and end its timer. Raises if the timer already fired."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    with _locked(sdir):
        record = _read(path)
        if record is None:
            return {"dev": dev, "confirmed": False, "pending": False}
        if record["status"] != "pending":
            path.unlink()
            raise ShapingError(
                f"confirm {dev}: too late, the change was {record['status'].replace('_', ' ')} at "
                f"{time.strftime('%H:%M:%S', time.localtime(record.get('finished_unix', 0)))} "
                "(the controller did not confirm within the deadline); shaping is back to the previous state"
            )
        _stop_timer(record)
        path.unlink()
    return {"dev": dev, "confirmed": True, "pending": False, "applied": record["applied"]}


def cancel(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> bool:
    """Forget a pending change without restoring (used by clear, which is the safe direction anyway)."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    with _locked(sdir):
        record = _read(path)
        if record is None:
            return False
        _stop_timer(record)
        path.unlink()
    return True


def rollback(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Restore the state before the pending change of `dev` now (the controller saw another host fail)."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    with _locked(sdir):
        record = _read(path)
        if record is None or record["status"] != "pending":
            if record is not None:
                path.unlink()
            return {"dev": dev, "rolled_back": False, "pending": False}
        _stop_timer(record)
        restore(dev, record["previous"], netns=netns)
        path.unlink()
    return {"dev": dev, "rolled_back": True, "pending": False}


def forget(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Leave nothing of `dev`'s commit-confirm state behind (`testbed down`): end its timer process if one still
    runs (whatever its record says), remove the record and the timer log, and the state directory once it is empty.
    Does not touch the shaping: the caller clears that."""
    sdir = state_dir(netns, base)
    if not sdir.is_dir():
        return {"dev": dev, "timer_ended": False, "state_removed": False}
    ended = False
    with _locked(sdir):
        record = _read(_record_path(sdir, dev))
        if record is not None and _timer_alive(record):
            _stop_timer(record)
            ended = True
        for path in (_record_path(sdir, dev), sdir / f"{dev}.timer.log", _record_path(sdir, dev).with_suffix(".tmp")):
            path.unlink(missing_ok=True)
        others = [p for p in sdir.iterdir() if p.name != ".lock"]
        if not others:
            (sdir / ".lock").unlink(missing_ok=True)
    removed = False
    with contextlib.suppress(OSError):  # another device's record or a concurrent arm() keeps the directory
        sdir.rmdir()
        removed = True
    return {"dev": dev, "timer_ended": ended, "state_removed": removed}


def _timer(path: Path, token: str) -> int:
    """The detached timer: wait for the deadline, then restore unless confirmed (record gone or token changed)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        record = _read(path)
        if record is None or record.get("token") != token or record.get("status") != "pending":
            return 0  # confirmed, cancelled or re-armed
        left = record["deadline_unix"] - time.time()
        if left <= 0:
            break
        time.sleep(min(left, 0.5))  # this process is the timer: waiting is its job
    with _locked(path.parent):
        record = _read(path)
        if record is None or record.get("token") != token or record.get("status") != "pending":
            return 0
        try:
            ns = record.get("netns")
            if ns and not os.path.exists(f"/run/netns/{ns}"):  # pyroute2 would re-create a deleted namespace
                raise ShapingError(f"network namespace {ns} is gone")
            restore(record["dev"], record["previous"], netns=ns)
            record["status"] = "rolled_back"
        except Exception as e:  # noqa: BLE001 - recorded for the late confirm/show, then the process ends
            record["status"] = "rollback_failed"
            record["error"] = str(e)
        record["finished_unix"] = time.time()
        record["timer_pid"] = None
        _write(path, record)
    print(f"{time.strftime('%F %T')} {record['dev']}: not confirmed in time, {record['status']}", flush=True)
    return 0 if record["status"] == "rolled_back" else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--timer":
        sys.exit(_timer(Path(sys.argv[2]), sys.argv[3]))
    print("usage: python -m shaping.commit_confirm --timer STATE_FILE TOKEN (started by `python -m shaping apply`)")
    sys.exit(2)
