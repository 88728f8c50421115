"""Provisioning lab hosts: the package files the hosts install (`stage_source`) and the Ansible run that installs
them (`run_playbook`), host keys checked (trust on first use only when asked: `accept_new_ssh_args`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbed.errors import ClusterError

REPO = Path(__file__).resolve().parents[3]
SOURCE_FILES = ("pyproject.toml", "README.md", "testbed", "shaping", "runners")  # what `pip install` on a host needs


def stage_source(dest: Path, repo: Path = REPO) -> Path:
    """Copy the package files the hosts install (SOURCE_FILES, no caches) to `dest`, readable by all and writable
    by none but the owner (the role unpacks them as root). Nothing else of the checkout (results, keys, inventories,
    .git, a venv) leaves this machine. Returns `dest`."""
    dest.mkdir(mode=0o755)
    for name in SOURCE_FILES:
        src = repo / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=False,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))  # fmt: skip
        elif src.is_file():
            shutil.copy2(src, dest / name)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def accept_new_ssh_args(env: dict[str, str]) -> str:
    """ANSIBLE_SSH_ARGS with `-o StrictHostKeyChecking=accept-new` first (ssh takes the first value of an option):
    an unknown host key is recorded, a changed one refused. The rest is what the run would use otherwise: the
    environment's ANSIBLE_SSH_ARGS, else ssh_args of its ANSIBLE_CONFIG, else Ansible's default. An inventory's
    ansible_ssh_args overrides this (and then its own host key policy applies)."""
    import configparser

    rest = env.get("ANSIBLE_SSH_ARGS")
    if rest is None:
        cfg = configparser.ConfigParser(interpolation=None)
        with contextlib.suppress(OSError, configparser.Error):
            cfg.read(env.get("ANSIBLE_CONFIG", ""))
        rest = cfg.get("ssh_connection", "ssh_args", fallback="-C -o ControlMaster=auto -o ControlPersist=60s")
    return f"-o StrictHostKeyChecking=accept-new {rest}".strip()


def run_playbook(
    inventory_path: Path,
    playbook: str,
    *,
    extra_vars: dict[str, Any] | None = None,
    accept_new_host_keys: bool = False,
    timeout_s: float = 1800,
) -> subprocess.CompletedProcess:
    """Run ansible/playbooks/`playbook` against the inventory with the staged package files; ClusterError naming the
    first failure."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    exe = str(exe) if exe.exists() else shutil.which("ansible-playbook")
    if not exe:
        raise ClusterError("ansible-playbook not found; install ansible-core (pip install 'ansible-core<2.21')")
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible" / "ansible.cfg"))
    env.pop("ANSIBLE_HOST_KEY_CHECKING", None)  # host keys are always checked (the config says so)
    if accept_new_host_keys:  # trust on first use; a CHANGED key is still refused (OpenSSH's accept-new)
        env["ANSIBLE_SSH_ARGS"] = accept_new_ssh_args(env)
    with tempfile.TemporaryDirectory(prefix="testbed-provision-") as private:  # mode 0700, removed after the run
        # what the role installs on the hosts: the package files only, packed where no other user can read
        source = stage_source(Path(private) / "src")
        ours = {"testbed_host_source_dir": str(source),
                "testbed_host_source_archive": str(Path(private) / "testbed-src.tar.gz")}  # fmt: skip
        argv = [exe, "-i", str(inventory_path), str(REPO / "ansible" / "playbooks" / playbook)]
        argv += ["-e", json.dumps({**ours, **(extra_vars or {})})]
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, umask=0o077)
    if res.returncode != 0:
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("fatal:", "failed:", "ERROR"))]
        lines += [ln for ln in res.stderr.splitlines() if ln.strip()]
        raise ClusterError(f"ansible-playbook {playbook} failed: {(lines or ['see its output'])[0][:400]}")
    return res
