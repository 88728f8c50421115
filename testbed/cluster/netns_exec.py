"""Run a command inside a named network namespace without the `ip` binary: what `ip netns exec NAME CMD` does.

    python -I testbed/cluster/netns_exec.py /run/netns/tb-x-h0 -- CMD [ARGS...]

The local cluster starts every rank, probe and `testbed exec` through this file (`argv_in_namespace`), run as a
script by the controller's own interpreter in isolated mode (`-I`: no PYTHON* variables, no user site, no current
directory on sys.path), so it needs nothing but the standard library and works where iproute2 is absent (the GPU
machine's microVM). It opens the namespace file, joins it with setns(CLONE_NEWNET) and execs CMD: the same PID, so
process groups, `/proc/PID/environ` and the namespace's process list see the command itself.

Why an exec wrapper and not `Popen(preexec_fn=...)`: preexec_fn runs Python in the child between fork and exec, which
is unsafe when the controller has threads (rich's progress refresh, the watch loop, pyroute2's): the child can
deadlock on a lock another thread held at fork. A wrapper process is single-threaded by construction.

As `ip netns exec` does, it also gives the command a private mount namespace with this network namespace's /sys
(what reads /sys/class/net, e.g. NCCL's NIC detection, then sees the namespace's eth0, not the machine's). That part
is best effort: where the kernel refuses it (some sandboxes), the command still runs in the right network namespace,
and /sys is left exactly as it was (a new sysfs is only ever mounted on top, never the old one removed).
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
NETNS_DIR = "/run/netns"


def argv_in_namespace(netns: str, argv: list[str], python: str | None = None) -> list[str]:
    """The argv that runs `argv` inside namespace `netns` (a name under /run/netns, e.g. tb-x-h0)."""
    if not netns or "/" in netns or netns in (".", ".."):
        raise ValueError(f"network namespace {netns!r}: expected a name under {NETNS_DIR}")
    return [python or sys.executable, "-I", os.path.abspath(__file__), f"{NETNS_DIR}/{netns}", "--", *argv]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter(path: str) -> None:
    """Join the network namespace at `path` (setns), then best-effort its /sys in a private mount namespace."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if hasattr(os, "setns"):  # Python >= 3.12
            os.setns(fd, CLONE_NEWNET)
        elif _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}, CLONE_NEWNET): {os.strerror(err)}")
    finally:
        os.close(fd)
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        return
    # never let the mount below propagate to the machine's mount namespace
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        return
    libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None)  # on top: the old /sys stays if this fails


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: netns_exec.py /run/netns/NAME -- CMD [ARGS...]\n")
        return 2
    path, cmd = argv[0], argv[2:]
    if os.path.dirname(path) != NETNS_DIR:
        sys.stderr.write(f"netns_exec: {path!r} is not a namespace under {NETNS_DIR}\n")
        return 2
    try:
        enter(path)
    except OSError as e:
        sys.stderr.write(f"netns_exec: cannot enter network namespace {path}: {e}\n")
        return 126
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"netns_exec: cannot run {cmd[0]!r} in {path}: {e}\n")
        return 127
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
