"""Which clusters exist: one JSON record per cluster name under the state directory, and a lock per name.

The state lives in /run/testbed by default (tmpfs: it vanishes on reboot together with the namespaces it
describes); `TESTBED_STATE_DIR` moves it (tests use a private one). `backends.open_cluster(name)` returns the backend
object for a recorded cluster; this module knows no backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shaping.files import atomic_write
from testbed.errors import InputError

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
