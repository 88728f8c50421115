"""Commit confirmed: a shaping change on a lab host undoes itself unless the controller confirms it in time.

Shaping the wrong NIC of a remote host (or shaping the right one to 10 kbit) can cut the controller off. Like a
router's ``commit confirmed``, every lab shaping change goes through here:

1. `snapshot()` reads the interface's shaping (egress root qdisc and ingress redirect) before the change.
2. The change is applied (`shaping.apply`).
3. `arm()` writes a pending record (previous state, applied plan, deadline, a random token) to a state file and starts
   a detached timer process (own session, no terminal, stdio to a log) that survives the SSH session.
4. The controller opens a *new* SSH connection (proof it can still reach the host) and runs ``confirm``: the pending
   record is removed and the timer ended. If the deadline passes first, the timer restores the previous state and
   marks the record ``rolled_back``; a late ``confirm`` then fails loudly.

State lives in ``/run/testbed-shaping/<netns inode>/`` (tmpfs: a reboot drops shaping and records alike), so hosts that
share a filesystem but not a network namespace (the test fixture's namespaced hosts) never mix their records.
A lock file serialises apply/confirm/timer. ``TESTBED_SHAPING_STATE_DIR`` moves the base directory (root only: through
sudo it is refused, see shaping/caller.py).

What a sudo user could aim at root here is closed off: the base and per-namespace directories are checked with lstat
(ours, not links, never writable by others; the per-namespace one mode 0700) before use; every file in them is opened
with O_NOFOLLOW (the records' temp files with O_EXCL); device names are validated before they become file names; and
the timer is ended only when its pid (> 1) is a root process whose command line is exactly the timer's own, with the
record's (hex) token. The timer runs ``python -I`` with a minimal environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shaping import caller, ingress, tc
from shaping.errors import InputError, PermissionDenied, ShapingError
from shaping.files import atomic_write, open_private, private_dir
from shaping.netns_route import interface_index, route_for
from shaping.plan import LinkShape

DEFAULT_BASE = "/run/testbed-shaping"
MAX_CONFIRM_WITHIN_S = 3600.0  # a dead-man timer that may wait longer than an hour is no protection
PROJECT_ROOT = Path(__file__).resolve().parent.parent
TOKEN_PATTERN = re.compile(r"[0-9a-f]{16,64}")
TIMER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the timer's whole environment
# The timer's program: the project root comes first on sys.path (python -I puts neither cwd nor PYTHONPATH there).
_TIMER_CODE = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from shaping.commit_confirm import _cli; sys.exit(_cli())"
)


def netns_id(netns: str | None = None) -> str:
    """A stable id of the network namespace the shaping happens in: the inode of its nsfs file."""
    if netns is not None:
        caller.check_netns(netns, trusted=True)  # a name, never a path (the CLI also refuses it through sudo)
    path = f"/run/netns/{netns}" if netns else "/proc/self/ns/net"
    try:
        return f"netns-{os.stat(path).st_ino}"
    except OSError as e:
        raise InputError(f"network namespace {netns or '(current)'!r} not found: {e.strerror}") from None


def state_dir(netns: str | None = None, base: str | Path | None = None) -> Path:
    """The state directory of `netns` (a path only: `_private()` creates and checks it). `base` is the caller's
    (code, not user input); TESTBED_SHAPING_STATE_DIR is honoured only for a caller who is plainly root."""
    override = os.environ.get("TESTBED_SHAPING_STATE_DIR")
    if base is None and override:
        caller.check_state_dir_override(None, trusted=not caller.untrusted())
    root = Path(base or override or DEFAULT_BASE)
    return root / netns_id(netns)


def _private(sdir: Path, *, create: bool) -> Path | None:
    """The state directory, checked: the base ours and not writable by others, `sdir` ours with mode 0700, neither a
    link. None when it does not exist and not `create`."""
    try:
        if private_dir(sdir.parent, create=create, group_other_ok=0o055) is None:
            return None
        return private_dir(sdir, create=create)
    except PermissionError as e:
        raise PermissionDenied(f"the commit-confirm state ({sdir}) needs root: {e.strerror}") from None
    except FileNotFoundError:
        raise InputError(f"state directory {sdir.parent}: its parent does not exist (it is made, not its parents)") from None


def check_within(within_s: float) -> float:
    """The confirmation deadline: a finite number of seconds in (0, MAX_CONFIRM_WITHIN_S]; InputError otherwise."""
    if isinstance(within_s, bool) or not isinstance(within_s, int | float) or not 0 < within_s <= MAX_CONFIRM_WITHIN_S:
        raise InputError(
            f"--confirm-within {within_s}: expected seconds in (0, {MAX_CONFIRM_WITHIN_S:g}] "
            "(the timer must be able to fire)"
        )
    return float(within_s)


def _record_path(sdir: Path, dev: str) -> Path:
    return sdir / f"{caller.check_dev(dev)}.pending.json"


@contextlib.contextmanager
def _locked(sdir: Path) -> Iterator[None]:
    _private(sdir, create=True)
    fd = open_private(sdir / ".lock", os.O_RDWR | os.O_CREAT)  # never truncated, never through a link
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read(path: Path) -> dict[str, Any] | None:
    try:
        fd = open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        try:
            record = json.loads(fh.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    return record if isinstance(record, dict) else None


def _write(path: Path, record: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(record, indent=1), mode=0o600)


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


def _timer_argv(path: Path, token: str) -> list[str]:
    """The timer's command line: what `arm()` starts and what `_timer_alive()` requires of a pid."""
    return [sys.executable, "-I", "-c", _TIMER_CODE, str(PROJECT_ROOT), "--timer", str(path), token]


def _proc_real_uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _timer_alive(record: dict[str, Any], path: Path) -> bool:
    """True only when the record's `timer_pid` is the timer of this very record: a pid > 1, a process of our uid whose
    command line is exactly `_timer_argv(path, token)` with a non-empty hex token (pid reuse, forged records)."""
    pid, token = record.get("timer_pid"), record.get("token")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return False
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        return False
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    want = [a.encode() for a in _timer_argv(path, token)]
    # argv[0] may be another spelling of the same interpreter (a venv link); everything after it must be the timer's
    return parts[1:] == [*want[1:], b""] and _proc_real_uid(pid) == os.geteuid()


def _stop_timer(record: dict[str, Any], path: Path) -> None:
    """End the record's timer process, after checking /proc that the pid still is that timer (pid reuse)."""
    if _timer_alive(record, path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record["timer_pid"], signal.SIGTERM)


def check_device(dev: str, netns: str | None) -> None:
    """InputError (naming the interfaces there are) unless `dev` exists in `netns`: before any record is touched."""
    with route_for(netns, "shaping") as ipr:
        interface_index(ipr, caller.check_dev(dev), netns)


def pending(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any] | None:
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    if _private(sdir, create=False) is None:
        return None
    return _read(path)


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
            _stop_timer(old, path)
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
        log = open_private(sdir / f"{dev}.timer.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            proc = subprocess.Popen(
                _timer_argv(path, token),  # python -I: no PYTHONPATH, user site or cwd on its sys.path
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session: the SSH session's hangup does not reach it
                close_fds=True,
                cwd="/",
                env={"PATH": TIMER_PATH, "LC_ALL": "C.UTF-8"},  # nothing of the caller's environment
            )
        finally:
            os.close(log)
        record["timer_pid"] = proc.pid
        _write(path, record)
    return {"armed": True, "within_s": within_s, "deadline_unix": deadline, "timer_pid": proc.pid, "token": token}


def confirm(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Keep the pending change of `dev`: remove the record and end its timer. Raises if the timer already fired."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    check_device(dev, netns)
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
        _stop_timer(record, path)
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
        _stop_timer(record, path)
        path.unlink()
    return True


def rollback(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Restore the state before the pending change of `dev` now (the controller saw another host fail)."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    check_device(dev, netns)
    with _locked(sdir):
        record = _read(path)
        if record is None or record["status"] != "pending":
            if record is not None:
                path.unlink()
            return {"dev": dev, "rolled_back": False, "pending": False}
        _stop_timer(record, path)
        restore(dev, record["previous"], netns=netns)
        path.unlink()
    return {"dev": dev, "rolled_back": True, "pending": False}


def forget(dev: str, *, netns: str | None = None, base: str | Path | None = None) -> dict[str, Any]:
    """Leave nothing of `dev`'s commit-confirm state behind (`testbed down`): end its timer process if one still
    runs (whatever its record says), remove the record and the timer log, and the state directory once it is empty.
    Does not touch the shaping: the caller clears that."""
    sdir = state_dir(netns, base)
    path = _record_path(sdir, dev)
    if _private(sdir, create=False) is None:
        return {"dev": dev, "timer_ended": False, "state_removed": False}
    ended = False
    with _locked(sdir):
        record = _read(path)
        if record is not None and _timer_alive(record, path):
            _stop_timer(record, path)
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
    if not TOKEN_PATTERN.fullmatch(token):
        return 2
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
            ns = caller.check_netns(record.get("netns"), trusted=True)
            caller.check_dev(record["dev"])  # validated by arm(); written to the log below, so checked again
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
    dev = record.get("dev")
    shown = dev if isinstance(dev, str) and caller.DEV_PATTERN.fullmatch(dev) else ascii(dev)  # one line, always
    print(f"{time.strftime('%F %T')} {shown}: not confirmed in time, {record['status']}", flush=True)
    return 0 if record["status"] == "rolled_back" else 1


def _cli(argv: list[str] | None = None) -> int:
    """The timer's entry point (see `_timer_argv`): --timer STATE_FILE TOKEN."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "--timer":
        return _timer(Path(argv[1]), argv[2])
    print("usage: --timer STATE_FILE TOKEN (the commit-confirm timer, started by `python -m shaping apply`)")
    return 2


if __name__ == "__main__":
    sys.exit(_cli())
