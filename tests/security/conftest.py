"""Fixtures of the adversarial suite: a throwaway unprivileged user, made for the session and removed after it.

The tests here play an attacker who holds what a lab user holds (a login, the sudo rule for the shaping helper, a
shared /tmp) and check that none of it reaches root. They run as root (CI does); without root they skip, saying so.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import random_suffix


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run argv as this user (setuid/setgid in the child, no login shell), output captured as text."""
        env = kw.pop("env", None) or {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(self.home)}
        return subprocess.run(
            argv, user=self.uid, group=self.gid, extra_groups=[], env=env, capture_output=True, text=True,
            check=False, **kw,
        )  # fmt: skip


@pytest.fixture(scope="session")
def unprivileged_user() -> User:
    """A fresh user `tbx<random>` with a home directory, deleted (with the home) at the end of the session."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a throwaway user to attack from")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd (Debian package passwd)")
    name = "tbx" + random_suffix(5)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    try:
        yield User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, check=False)
