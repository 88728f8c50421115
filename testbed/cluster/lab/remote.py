"""Remote execution on lab hosts: a command started detached in its own process group (`LabRankProcess`), and the
shell lines that poll it, end it (only while its leader carries the token it was started with: no pid-reuse
accidents) and end a cluster's leftover processes. Every line quotes its words (`ssh.command_line`)."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from testbed.cluster.base import Host, RankProcess
from testbed.cluster.ssh import SSHConnection, command_line
from testbed.errors import LaunchError, TestbedError

TOKEN_ENV = "TESTBED_LAB_TOKEN"


class Connections(Protocol):
    """What a started process needs of its cluster: the (cached, reopened when closed) connection to a host."""

    def conn(self, name: str) -> SSHConnection: ...


class LabRankProcess(RankProcess):
    """A command started on a lab host with `setsid` (its own session and process group); output in a remote log
    that is copied to `log_path` when it ends or is killed."""

    def __init__(self, cluster: Connections, host: Host, token: str, pgid: int, remote: dict[str, str], log_path: Path):
        self.cluster, self.host, self.token, self.pgid = cluster, host, token, pgid
        self.remote, self.log_path = remote, log_path
        self.returncode: int | None = None
        self._signalled: int | None = None

    @property
    def pid(self) -> int:
        return self.pgid

    def _conn(self) -> SSHConnection:
        return self.cluster.conn(self.host.name)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        out = self._conn().run_line(poll_status_line(self.remote["rc"], self.token, self.pgid), timeout_s=30).stdout.strip()
        if out == "alive":
            return None
        if out.lstrip("-").isdigit():
            self.returncode = int(out)
        else:  # ended without writing its status: killed (by us or by someone else)
            self.returncode = -(self._signalled or 9)
        self.collect_log()
        return self.returncode

    def wait(self, timeout_s: float | None = None) -> int:
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.remote["log"], timeout_s)
            time.sleep(0.2)  # each poll is an SSH round trip; this paces them
        return rc

    def kill_group(self, grace_s: float = 3.0) -> None:
        """SIGTERM the remote process group, SIGKILL what is left after `grace_s`, then collect the log."""
        if self.returncode is not None:
            return
        self._signalled = 15
        self._conn().run_line(kill_group_script(self.pgid, self.token, grace_s), timeout_s=grace_s + 30)
        self.returncode = self.poll()

    def handle(self) -> dict[str, Any]:
        return {"host": self.host.name, "pgid": self.pgid, "token": self.token}

    def collect_log(self) -> None:
        """Copy the remote log here, then remove the process's private directory on the host (it has ended)."""
        try:
            self._conn().get_file(self.remote["log"], self.log_path)
        except (OSError, TestbedError):
            pass  # the log is a courtesy; the exit status is what the launcher acts on
        with contextlib.suppress(OSError, TestbedError, subprocess.TimeoutExpired):
            self._conn().run_line(command_line(["rm", "-rf", "--", self.remote["dir"]]), timeout_s=30)


def poll_status_line(rc_path: str, token: str, pgid: int) -> str:
    """Remote shell printing a detached command's exit status, `alive`, or `gone` (ended without one: killed). The
    status is read again once the leader is gone: it writes the status and exits between the first read and the
    liveness check (a rank that ended well was once reported killed, -9, that way)."""
    q = shlex.quote
    return (
        f"cat {q(rc_path)} 2>/dev/null || "
        f"(grep -qz {q(f'{TOKEN_ENV}={token}')} /proc/{int(pgid)}/environ 2>/dev/null && echo alive) || "
        f"cat {q(rc_path)} 2>/dev/null || echo gone"
    )


def kill_group_script(pgid: int, token: str, grace_s: float) -> str:
    """Remote shell: end process group `pgid` if its leader still carries `token` (no pid-reuse accidents)."""
    if not isinstance(pgid, int) or pgid <= 1:
        raise LaunchError(f"refusing to signal process group {pgid!r}")
    marker = shlex.quote(f"{TOKEN_ENV}={token}")
    return _end_group_sh(str(pgid), marker, steps=max(1, int(grace_s * 10)), otherwise="exit 0") + "; true"


def _end_group_sh(pgid: str, marker: str, *, steps: int, otherwise: str) -> str:
    """The one shell fragment that ends a remote process group: unless the leader's environment holds `marker` (a
    shell word) run `otherwise`; else SIGTERM the group, wait up to `steps` x 0.1 s, then SIGKILL what is left.
    `pgid` is a number or a shell variable such as "$p"."""
    return (
        f"grep -qz {marker} /proc/{pgid}/environ 2>/dev/null || {otherwise}; "
        f"kill -TERM -- -{pgid} 2>/dev/null; i=0; "
        f"while kill -0 -- -{pgid} 2>/dev/null && [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); done; "
        f"kill -KILL -- -{pgid} 2>/dev/null"
    )


def _own_dir_test(var: str) -> str:
    """Shell test: `var` (e.g. "$d") is a directory, not a link, of the running user ($u, set by the caller)."""
    return f'[ -d "{var}" ] && [ ! -L "{var}" ] && [ "$(stat -c %u "{var}")" = "$u" ]'


def end_processes_script(run_parent: str | PurePosixPath, cluster: str, host: str) -> str:
    """Remote shell: end every process group `cluster` started on `host` that still runs (whoever started it: any
    controller process), then remove their private directories. A group is signalled only if its leader carries the
    token its directory is named after (no pid-reuse accidents); directories that are not the login user's own are
    never read."""
    prefix = f"tb-{cluster}-"
    end = _end_group_sh("$p", f'"{TOKEN_ENV}=$t"', steps=30, otherwise="exit 0")
    return (
        f"u=$(id -u); for d in {shlex.quote(f'{str(run_parent).rstrip(chr(47))}/{prefix}{host}-')}*; do "
        f"{_own_dir_test('$d')} || continue; "
        f'if [ -f "$d/pid" ] && [ ! -f "$d/rc" ]; then p=$(cat "$d/pid"); t=$(basename "$d"); t=${{t#{prefix}}}; '
        f'case "$p" in \'\'|*[!0-9]*) ;; *) [ "$p" -gt 1 ] && ( {end} ) ;; esac; fi; '
        'rm -rf -- "$d"; done; true'
    )


def sweep_attempts_line(pattern: str) -> str:
    """Remote shell: remove the attempts' directories `pattern`* (trials that failed before fetching) that are the
    login user's own directories (never a link, never another user's)."""
    return f"u=$(id -u); for d in {shlex.quote(pattern)}*; do {_own_dir_test('$d')} && rm -rf -- \"$d\"; done; true"


def command_for(argv: list[str]) -> str:
    """The quoted command line lab hosts run for argv (exposed for tests and --dry-run output)."""
    return command_line(argv)
