"""Who runs the shaping tool, and what they may name: the line where privilege begins on a lab host.

Lab users may hold a sudo rule for the root-owned helper (ansible/roles/testbed_host, docs/lab-guide.md "Threat model
and the sudo rule"). Through it every argument and environment variable comes from someone who is not root, so:

- a device name is a Linux interface name (`^[A-Za-z0-9_.:-]{1,15}$`, not `.` or `..`), and the helper pins it to the
  host's configured data NIC(s);
- a network namespace is a name under /run/netns (never a path), and through sudo none is accepted at all (the rule
  shapes the host's own data NIC);
- the state directory cannot be moved (`--state-dir`, TESTBED_SHAPING_STATE_DIR): only root itself may do that.

`untrusted()` is True under sudo (SUDO_UID set: sudo sets it, a user cannot remove it) and whenever the real or
effective uid is not 0.
"""

from __future__ import annotations

import os
import re

from shaping.errors import InputError

DEV_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
NETNS_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def untrusted(environ: dict[str, str] | None = None) -> bool:
    """True when the caller is not plainly root: running through sudo, or with a non-zero real/effective uid."""
    env = os.environ if environ is None else environ
    return "SUDO_UID" in env or os.getuid() != 0 or os.geteuid() != 0


def check_dev(dev: str, allowed: tuple[str, ...] | None = None) -> str:
    """`dev` when it is a valid interface name (and one of `allowed`, when given); InputError otherwise."""
    if not isinstance(dev, str) or not DEV_PATTERN.fullmatch(dev) or dev in (".", ".."):
        raise InputError(
            f"--dev {dev!r}: not an interface name; expected 1-15 of A-Z a-z 0-9 _ . : - (and not . or ..)"
        )
    if allowed is not None and dev not in allowed:
        raise InputError(f"--dev {dev}: this helper shapes only the host's data NIC ({', '.join(allowed) or 'none'})")
    return dev


def check_netns(netns: str | None, *, trusted: bool) -> str | None:
    """`netns` when it is a plain namespace name (what /run/netns/<name> holds) and the caller may name one."""
    if netns is None:
        return None
    if not isinstance(netns, str) or not NETNS_PATTERN.fullmatch(netns) or netns in (".", ".."):
        raise InputError(
            f"--netns {netns!r}: not a namespace name; expected 1-64 of A-Z a-z 0-9 _ . - (a name under /run/netns, "
            "never a path)"
        )
    if not trusted:
        raise InputError(
            f"--netns {netns}: not accepted through sudo or from a non-root caller (the sudo rule shapes this host's "
            "data NIC only); run as root to shape an interface in a namespace"
        )
    return netns


def check_state_dir_override(state_dir: str | None, *, trusted: bool, environ: dict[str, str] | None = None) -> None:
    """InputError when an untrusted caller tries to move the commit-confirm state (flag or environment)."""
    env = os.environ if environ is None else environ
    if trusted:
        return
    if state_dir is not None:
        raise InputError(
            f"--state-dir {state_dir}: not accepted through sudo or from a non-root caller; the state lives in "
            "/run/testbed-shaping (root's, mode 0700)"
        )
    if env.get("TESTBED_SHAPING_STATE_DIR"):
        raise InputError(
            "TESTBED_SHAPING_STATE_DIR is set: not accepted through sudo or from a non-root caller; the state lives in "
            "/run/testbed-shaping (root's, mode 0700)"
        )
