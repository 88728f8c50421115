"""Lab backend: real hosts listed in an Ansible inventory, reached over SSH (paramiko).

The same shaping code as local mode runs on each host (`python -m shaping ...`, see shaping/__main__.py): every change
is commit-confirmed (a timer on the host restores the previous qdiscs unless this controller confirms over a *new* SSH
connection within `confirm_within_s`), and the interface carrying the SSH session is refused unless forced.

Inventory (YAML, Ansible layout; see ansible/inventory.example.yml). Per host, after merging group vars:
  ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file   how to log in (key only)
  ansible_ssh_common_args "-o UserKnownHostsFile=F"  or testbed_known_hosts: the known_hosts to verify against
  testbed_data_iface (required)   the NIC that carries training traffic and gets shaped
  testbed_data_address            its IPv4 address (default: read from the interface)
  testbed_gpus_per_host           GPUs each host must show (nvidia-smi), unless allow_cpu
  testbed_python                  Python on the host with the project importable (default /opt/testbed/venv/bin/python)
  testbed_project_dir             the project's source on the host (default /opt/testbed/src)
  testbed_run_dir                 where each started process and each trial attempt gets a fresh private directory
                                  (mode 0700, checked with lstat) on the host (default /tmp; it must belong to root or
                                  the login user and be writable by nobody else unless sticky)
  testbed_shaping_offload         HTB hardware offload: off (default), auto or on (see docs/lab-guide.md, High rates)
  testbed_shaping_ingress         also shape what arrives, via an ifb (default true; false with offload: egress only)
  ansible_become                  true: shaping commands run as `sudo -n testbed_shaping_helper ...` (no root SSH);
                                  the provision playbook installs the helper and a sudoers rule for it
  testbed_shaping_helper          the root-owned shaping wrapper sudo may run (default /usr/local/sbin/testbed-shaping)
  testbed_shaping_peers           CIDRs whose traffic is shaped (default: the other hosts' data addresses; `all`:
                                  every packet on the data NIC); the rest of the NIC's traffic passes unshaped
Values are used literally (never through a shell: every remote command is an argv quoted word by word); Jinja
templates are not evaluated here and are refused in the values this backend reads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib.resources
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from shaping.plan import LinkShape
from testbed.cluster import registry
from testbed.cluster.base import Cluster, Host, RankProcess
from testbed.cluster.ssh import (
    SSHConnection,
    SSHTarget,
    command_line,
    detached_command_line,
    env_file_text,
    private_dir_check_line,
    private_dir_line,
)
from testbed.errors import ClusterError, InputError, LaunchError, ShapingError, TestbedError

REPO = Path(__file__).resolve().parents[2]
MIN_PYTHON = (3, 11)
DEFAULT_PYTHON = "/opt/testbed/venv/bin/python"
DEFAULT_PROJECT_DIR = "/opt/testbed/src"
DEFAULT_RUN_DIR = "/tmp"  # parent of the private per-process and per-attempt directories
DEFAULT_CONFIRM_WITHIN_S = 60.0
DEFAULT_SHAPING_HELPER = "/usr/local/sbin/testbed-shaping"  # installed by the testbed_host role (sudoers rule)
TOKEN_ENV = "TESTBED_LAB_TOKEN"

# Runs on each host with the host's Python (its source is sent: the host may not have this checkout's version).
HOST_FACTS = importlib.resources.files("testbed.cluster").joinpath("host_facts.py").read_text()


# ------------------------------------------------------------------------------------------------------ inventory
@dataclasses.dataclass(frozen=True)
class LabHostSpec:
    name: str
    ssh: SSHTarget
    data_iface: str
    data_address: str | None
    gpus: int
    python: str
    project_dir: str
    run_dir: str
    shaping_peers: tuple[str, ...] | None = None  # testbed_shaping_peers; None: the other hosts' data addresses
    shaping_offload: str = "off"  # testbed_shaping_offload: off | auto | on
    shaping_ingress: bool = True  # testbed_shaping_ingress
    become: bool = False  # ansible_become: shaping through `sudo -n` and the helper, not as the login user
    shaping_helper: str = DEFAULT_SHAPING_HELPER  # testbed_shaping_helper


def _literal(host: str, key: str, value: Any) -> str:
    text = str(value)
    if "{{" in text or "{%" in text:
        raise InputError(
            f"inventory host {host}: {key} is a Jinja template ({text!r}); the lab backend reads values "
            "literally, give a plain value"
        )
    return text


def _known_hosts_from_args(args: str) -> str | None:
    words = shlex.split(args or "")
    for i, w in enumerate(words):
        opt = None
        if w == "-o" and i + 1 < len(words):
            opt = words[i + 1]
        elif w.startswith("-o") and len(w) > 2:
            opt = w[2:]
        if opt and re.match(r"(?i)^userknownhostsfile[ =]", opt):
            return re.split(r"[ =]", opt, maxsplit=1)[1].strip().split()[0]
    return None


def _walk(group: dict | None, inherited: dict, out: dict[str, dict]) -> None:
    group = group or {}
    if not isinstance(group, dict):
        raise InputError(f"inventory: expected a mapping of hosts/vars/children, got {type(group).__name__}")
    merged = {**inherited, **(group.get("vars") or {})}
    for name, hvars in (group.get("hosts") or {}).items():
        out[str(name)] = {**out.get(str(name), {}), **merged, **(hvars or {})}
    for child in (group.get("children") or {}).values():
        _walk(child, merged, out)


def load_inventory(path: str | Path) -> list[LabHostSpec]:
    """Read a YAML Ansible inventory into host specs. InputError on anything missing or malformed."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise InputError(f"--inventory {path}: no such file") from None
    except yaml.YAMLError as e:
        raise InputError(
            f"--inventory {path}: not valid YAML ({str(e).splitlines()[0]}); the lab backend reads YAML inventories "
            f"(convert an INI one: ansible-inventory -i {path} -y --list > inventory.yml)"
        ) from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"--inventory {path}: expected a YAML Ansible inventory (all: hosts: ...)")
    raw: dict[str, dict] = {}
    for group in data.values():
        _walk(group, {}, raw)
    if not raw:
        raise InputError(f"--inventory {path}: lists no hosts")
    specs = []
    for name, v in raw.items():
        if "testbed_data_iface" not in v:
            raise InputError(f"inventory host {name}: testbed_data_iface is missing (the NIC to shape, e.g. ens1f0)")
        kh = v.get("testbed_known_hosts") or _known_hosts_from_args(str(v.get("ansible_ssh_common_args", "")))
        key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
        try:
            port = int(v.get("ansible_port", v.get("ansible_ssh_port", 22)))
            gpus = int(v.get("testbed_gpus_per_host", 0))
        except (TypeError, ValueError):
            raise InputError(
                f"inventory host {name}: ansible_port and testbed_gpus_per_host must be integers"
            ) from None
        if gpus < 0 or not 0 < port < 65536:
            raise InputError(f"inventory host {name}: port {port} or testbed_gpus_per_host {gpus} out of range")
        specs.append(
            LabHostSpec(
                name=name,
                ssh=SSHTarget(
                    name=name,
                    address=_literal(name, "ansible_host", v.get("ansible_host", name)),
                    port=port,
                    user=_literal(name, "ansible_user", v.get("ansible_user", "root")),
                    key_file=_literal(name, "ansible_ssh_private_key_file", key) if key else None,
                    known_hosts=_literal(name, "known_hosts", kh) if kh else None,
                ),
                data_iface=_literal(name, "testbed_data_iface", v["testbed_data_iface"]),
                data_address=_literal(name, "testbed_data_address", v["testbed_data_address"])
                if v.get("testbed_data_address")
                else None,
                gpus=gpus,
                python=_literal(name, "testbed_python", v.get("testbed_python", DEFAULT_PYTHON)),
                project_dir=_literal(name, "testbed_project_dir", v.get("testbed_project_dir", DEFAULT_PROJECT_DIR)),
                run_dir=_literal(name, "testbed_run_dir", v.get("testbed_run_dir", DEFAULT_RUN_DIR)),
                shaping_peers=inventory_peers(name, v.get("testbed_shaping_peers")),
                shaping_offload=_offload_mode(name, v.get("testbed_shaping_offload", "off")),
                shaping_ingress=_flag(name, "testbed_shaping_ingress", v.get("testbed_shaping_ingress", True)),
                become=_flag(name, "ansible_become", v.get("ansible_become", False)),
                shaping_helper=_literal(
                    name, "testbed_shaping_helper", v.get("testbed_shaping_helper", DEFAULT_SHAPING_HELPER)
                ),
            )
        )
    return specs


def _offload_mode(host: str, value: Any) -> str:
    from shaping.highrate import OFFLOAD_MODES

    mode = "off" if value is False else "on" if value is True else str(value).strip().lower()
    if mode not in OFFLOAD_MODES:
        raise InputError(f"inventory host {host}: testbed_shaping_offload {value!r}; expected off, auto or on")
    return mode


def _flag(host: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return str(value).strip().lower() in ("true", "yes", "on", "1")
    raise InputError(f"inventory host {host}: {key} {value!r}; expected true or false")


def inventory_peers(host: str, value: Any) -> tuple[str, ...] | None:
    """`testbed_shaping_peers` of a host: None when unset (default peers), () for `all` (shape every packet), else
    normalised CIDRs (a list or a comma-separated string)."""
    from shaping.classify import parse_peers

    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "all":
        return ()
    if not isinstance(value, str | list):
        raise InputError(f"inventory host {host}: testbed_shaping_peers must be a list of CIDRs, a string or all")
    return parse_peers(value, f"inventory host {host}: testbed_shaping_peers")


def evaluate_facts(
    spec: LabHostSpec, facts: dict[str, Any], *, rate_bps: int | None = None, allow_cpu: bool = False
) -> list[tuple[type[TestbedError], str]]:
    """What stops this host from taking part, as (error class, one-line message) pairs. Pure: unit-tested."""
    from shaping.units import format_rate

    problems: list[tuple[type[TestbedError], str]] = []
    n = spec.name
    version = tuple(facts.get("python") or (0,))
    if version < MIN_PYTHON:
        problems.append(
            (
                ClusterError,
                f"host {n}: Python {'.'.join(map(str, version))} at {spec.python} is too old; the testbed needs "
                f"{'.'.join(map(str, MIN_PYTHON))}+ (set testbed_python, or run the provision playbook)",
            )
        )
        return problems
    if not facts.get("iface_exists"):
        have = ", ".join(facts.get("ifaces") or []) or "none"
        problems.append(
            (
                ClusterError,
                f"host {n}: no data interface {spec.data_iface!r} (testbed_data_iface); the host has: {have}",
            )
        )
    if not facts.get("project"):
        problems.append(
            (
                ClusterError,
                f"host {n}: the testbed is not importable by {spec.python} in "
                f"{spec.project_dir} ({facts.get('project_error', '?')}); run the provision "
                "playbook",
            )
        )
    if facts.get("torch") is None:
        problems.append(
            (ClusterError, f"host {n}: torch is not importable by {spec.python} ({facts.get('torch_error', '?')})")
        )
    if spec.gpus and facts.get("gpus", 0) < spec.gpus and not allow_cpu:
        problems.append(
            (
                ClusterError,
                f"host {n}: testbed_gpus_per_host is {spec.gpus} but nvidia-smi shows {facts.get('gpus', 0)} GPUs"
                f"{'' if facts.get('nvidia_smi') else ' (nvidia-smi not found)'}; pass --allow-cpu to run on CPU",
            )
        )
    speed = facts.get("nic_speed_mbps")
    if rate_bps and speed and speed * 1_000_000 < rate_bps:
        problems.append(
            (
                InputError,
                f"host {n}: {spec.data_iface} links at {format_rate(speed * 1e6)}, slower than the requested "
                f"{format_rate(rate_bps)}; shaping can only lower a rate",
            )
        )
    return problems


AGREEING_VERSIONS = (("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"), ("driver_version", "NVIDIA driver"))


def version_disagreements(facts_by_host: dict[str, dict[str, Any]]) -> list[str]:
    """One line per software version that differs between hosts (torch, CUDA, NCCL, driver). Ranks of one job with
    mixed NCCL versions hang or fail in ways users cannot debug, so `up` refuses such a cluster. Pure: unit-tested."""
    out = []
    for key, what in AGREEING_VERSIONS:
        seen: dict[str, list[str]] = {}
        for host, facts in sorted(facts_by_host.items()):
            seen.setdefault(str(facts.get(key) or "none"), []).append(host)
        if len(seen) > 1:
            groups = "; ".join(f"{v} on {', '.join(hosts)}" for v, hosts in sorted(seen.items()))
            out.append(f"hosts disagree on the {what} version ({groups}); install one version on every host "
                       "(the provision playbook does, from one checkout)")  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------- provisioning
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


# ------------------------------------------------------------------------------------------------- rank processes
class LabRankProcess(RankProcess):
    """A command started on a lab host with `setsid` (its own session and process group); output in a remote log
    that is copied to `log_path` when it ends or is killed."""

    def __init__(self, cluster: LabCluster, host: Host, token: str, pgid: int, remote: dict[str, str], log_path: Path):
        self.cluster, self.host, self.token, self.pgid = cluster, host, token, pgid
        self.remote, self.log_path = remote, log_path
        self.returncode: int | None = None
        self._signalled: int | None = None

    @property
    def pid(self) -> int:
        return self.pgid

    def _conn(self) -> SSHConnection:
        return self.cluster._conn(self.host.name)

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


# ---------------------------------------------------------------------------------------------------- the cluster
class LabCluster(Cluster):
    """Hosts from an inventory; commands over SSH; shaping through `python -m shaping` on each host."""

    backend = "lab"

    def __init__(
        self,
        name: str,
        specs: list[LabHostSpec],
        *,
        inventory_path: str | Path | None = None,
        accept_new_host_keys: bool = False,
        allow_cpu: bool = False,
    ):
        if not specs:
            raise InputError("a lab cluster needs at least one host")
        self.name = name
        self.specs = {s.name: s for s in specs}
        self.inventory_path = Path(inventory_path).resolve() if inventory_path else None
        self.accept_new_host_keys = accept_new_host_keys
        self.allow_cpu = allow_cpu
        self._conns: dict[str, SSHConnection] = {}
        self._hosts: list[Host] | None = None
        self._started: list[LabRankProcess] = []
        self._attempt: dict[str, Any] | None = None  # the latest rank_out_dir: path, hosts made on, hosts fetched
        self.facts: dict[str, dict[str, Any]] = {}
        self.record: dict[str, Any] | None = None  # the registry record this cluster was opened from

    # -------------------------------------------------------------------------------------------------- building
    @classmethod
    def from_inventory(
        cls,
        path: str | Path,
        *,
        name: str = "lab",
        accept_new_host_keys: bool = False,
        allow_cpu: bool = False,
    ) -> LabCluster:
        """Read the inventory (no connection yet). InputError if it is missing or malformed."""
        return cls(
            name,
            load_inventory(path),
            inventory_path=path,
            accept_new_host_keys=accept_new_host_keys,
            allow_cpu=allow_cpu,
        )

    @classmethod
    def up(
        cls,
        name: str,
        inventory: str | Path,
        *,
        shape: LinkShape | None = None,
        accept_new_host_keys: bool = False,
        allow_cpu: bool = False,
        run_playbook: bool = True,
    ) -> tuple[LabCluster, dict[str, Any]]:
        """Bring a lab cluster up: read the inventory, run the provision playbook (unless run_playbook=False), check
        every host (reachability, host keys, data NIC, Python, GPUs, NIC speed against the rate), shape if a shape is
        given (commit-confirmed), then record the cluster so `status`, `exec`, `shape`, `run`, `sweep` and `down`
        reopen it by name. Nothing half-done: a failure after shaping clears it again, and no record is written.
        Returns (cluster, its status); the cluster's SSH connections are closed."""
        registry.check_name(name)
        cluster = cls.from_inventory(
            inventory, name=name, accept_new_host_keys=accept_new_host_keys, allow_cpu=allow_cpu
        )
        try:
            cluster.provision(run_playbook=run_playbook, rate_bps=shape.rate_bps if shape else None)
            status = cluster.shape_and_record(shape)
        finally:
            cluster.close()
        return cluster, status

    def shape_and_record(self, shape: LinkShape | None) -> dict[str, Any]:
        """The end of `up` once every host passed its checks: shape if asked (commit-confirmed), write the record,
        return the status. A failure clears the shaping it applied again and leaves no record."""
        shaped = False
        try:
            if shape is not None:
                self.apply_shaping(shape)
                shaped = True
            self.record = {**self.to_record(), "shape": shape.to_dict() if shape else None}
            registry.save_record(self.name, self.record)
            return self.status()
        except BaseException:
            if shaped:
                with contextlib.suppress(TestbedError):
                    self.clear_shaping()
            raise

    def to_record(self) -> dict[str, Any]:
        """What the cluster registry stores so later commands (status, run, down) can reopen this cluster."""
        return {
            "name": self.name,
            "backend": self.backend,
            "inventory": str(self.inventory_path) if self.inventory_path else None,
            "allow_cpu": self.allow_cpu,
            "hosts": [{"name": h, "ssh": s.ssh.where, "data_iface": s.data_iface} for h, s in self.specs.items()],
            "shape": (self.record or {}).get("shape"),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LabCluster:
        if not record.get("inventory"):
            raise InputError(f"lab cluster {record.get('name')!r} was recorded without an inventory path")
        cluster = cls.from_inventory(record["inventory"], name=record["name"], allow_cpu=bool(record.get("allow_cpu")))
        cluster.record = dict(record)
        return cluster

    def __enter__(self) -> LabCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.kill_started()
        self.close()

    def _conn(self, name: str) -> SSHConnection:
        if name not in self._conns:
            self._conns[name] = SSHConnection(self.specs[name].ssh, accept_new_host_keys=self.accept_new_host_keys)
        return self._conns[name]

    def _fresh_conn(self, name: str) -> SSHConnection:
        """A new connection (not the cached one): confirming shaping over it proves the host is still reachable."""
        return SSHConnection(self.specs[name].ssh, accept_new_host_keys=False)

    transport = "SSH"

    def _where(self, name: str) -> dict[str, str]:
        """How `status` says the host is reached."""
        return {"ssh": self.specs[name].ssh.where}

    def _spec(self, host: Host | str) -> LabHostSpec:
        name = host if isinstance(host, str) else host.name
        if name not in self.specs:
            raise InputError(f"unknown host {name!r}; cluster {self.name!r} has: {', '.join(self.specs)}")
        return self.specs[name]

    def _each(self, fn, names: list[str]) -> dict[str, Any]:
        """Run fn(name) for each host in parallel; return {name: result or the TestbedError it raised}."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(names) or 1)) as pool:
            futures = {n: pool.submit(fn, n) for n in names}
        out = {}
        for n, f in futures.items():
            try:
                out[n] = f.result()
            except TestbedError as e:
                out[n] = e
        return out

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    # --------------------------------------------------------------------------------------------- Cluster API
    def hosts(self) -> list[Host]:
        if self._hosts is None:
            missing = [n for n, s in self.specs.items() if not s.data_address]
            found = self._each(self._data_address, missing)
            for r in found.values():
                if isinstance(r, TestbedError):
                    raise r
            self._hosts = [
                Host(name=n, address=s.data_address or found[n], data_iface=s.data_iface, netns=None,
                     gpus=() if self.allow_cpu else tuple(range(s.gpus)))  # cuda:LOCAL_RANK on the host's own
                for n, s in self.specs.items()  # fmt: skip
            ]
        return list(self._hosts)

    def _data_address(self, name: str) -> str:
        s = self.specs[name]
        res = self._conn(name).run(["ip", "-j", "-4", "addr", "show", "dev", s.data_iface], timeout_s=30)
        try:
            addrs = [a["local"] for link in json.loads(res.stdout or "[]") for a in link.get("addr_info", [])]
        except (ValueError, KeyError, TypeError):
            addrs = []
        if res.returncode != 0 or not addrs:
            raise ClusterError(
                f"host {name}: cannot read an IPv4 address of data interface {s.data_iface!r} "
                f"({res.stderr.strip() or 'no address'}); set testbed_data_address"
            )
        return addrs[0]

    def command_prefix(self, host: Host) -> None:
        """Lab hosts are reached over SSH: `testbed exec` goes through `run`."""
        return None

    def threads_per_rank(self, world_size: int) -> int:
        """0: each lab host keeps its own default (its ranks share that host, not this machine)."""
        return 0

    def _host_argv(self, spec: LabHostSpec, argv: list[str]) -> list[str]:
        """argv[0] 'python', 'python3' or this controller's own interpreter means the host's testbed_python."""
        if argv and argv[0] in ("python", "python3", sys.executable):
            return [spec.python, *argv[1:]]
        return list(argv)

    def run(self, host: Host | str, argv: list[str], *, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        spec = self._spec(host)
        return self._conn(spec.name).run(self._host_argv(spec, argv), cwd=spec.project_dir, timeout_s=timeout_s)

    def _run_parent(self, spec: LabHostSpec) -> PurePosixPath:
        """testbed_run_dir: where the private directories of this cluster's processes and attempts are made."""
        return PurePosixPath(spec.run_dir)

    def _process_dir_name(self, token: str) -> str:
        """The private directory of one started process (log, pid, status, its environment until it starts)."""
        return f"tb-{self.name}-{token}"

    def start(
        self,
        host: Host | str,
        argv: list[str],
        *,
        env: dict[str, str],
        log_path: Path,
        workdir: Path | None = None,
    ) -> LabRankProcess:
        """Start argv on the host in a new process group (setsid); its output goes to a log on the host, copied to
        `log_path` here when it ends. `workdir` (on the host) defaults to testbed_project_dir. Its files live in a
        fresh private directory (`ssh.private_dir_line`) and `env` travels over stdin, never on a command line."""
        import time

        spec = self._spec(host)
        h = host if isinstance(host, Host) else self.host(host)
        self._make_attempt_dir(spec)
        token = f"{spec.name}-{secrets.token_hex(6)}"
        pdir = self._run_parent(spec) / self._process_dir_name(token)
        remote = {"dir": str(pdir), "log": str(pdir / "log"), "pid": str(pdir / "pid"), "rc": str(pdir / "rc")}
        detached = detached_command_line(
            self._host_argv(spec, argv),
            run_dir=pdir,
            cwd=str(workdir) if workdir else spec.project_dir,
            marker=f"{TOKEN_ENV}={token}",
        )
        line = f"{private_dir_line(self._run_parent(spec), pdir.name)} && {detached}"
        conn = self._conn(spec.name)
        res = conn.run_line(line, timeout_s=30, stdin=env_file_text(dict(env)))
        if res.returncode != 0:
            raise LaunchError(
                f"host {spec.name}: starting {argv[0]} failed: {res.stderr.strip() or res.stdout.strip()}"
            )
        deadline = time.monotonic() + 15
        while True:  # the detached shell writes its pid first thing
            out = conn.run_line(f"cat {shlex.quote(remote['pid'])} 2>/dev/null", timeout_s=30).stdout.strip()
            if out.isdigit() and int(out) > 1:
                break
            if time.monotonic() > deadline:
                raise LaunchError(f"host {spec.name}: {argv[0]} did not start (no pid file {remote['pid']})")
        proc = LabRankProcess(self, h, token, int(out), remote, Path(log_path))
        self._started.append(proc)
        return proc

    def kill_started(self) -> None:
        """End every process group this object started that still runs (failure, Ctrl-C)."""
        for p in self._started:
            try:
                p.kill_group()
            except TestbedError:
                pass

    def fetch(self, host: Host | str, remote_dir: Path, local_dir: Path) -> None:
        """Copy a directory written on the host (e.g. `rank_out_dir`) here (SFTP, or tar through a job step); a no-op
        for the same path. An attempt's directory is checked first (still the login user's, mode 0700, not a link)
        and removed on the host once copied; on a run directory that hosts share (one filesystem), the first host's
        copy brought every host's files."""
        spec = self._spec(host)
        if str(PurePosixPath(remote_dir)) == str(Path(local_dir).resolve()):
            return
        conn = self._conn(spec.name)
        attempt = self._attempt
        if attempt is None or str(PurePosixPath(remote_dir)) != attempt["path"]:
            conn.get_tree(str(remote_dir), Path(local_dir))
            return
        q = shlex.quote(attempt["path"])
        if attempt["fetched"] and conn.run_line(f"[ -e {q} ] || [ -L {q} ]", timeout_s=30).returncode != 0:
            return  # removed by the fetch from another host: the run directory is shared
        res = conn.run_line(private_dir_check_line(attempt["path"]), timeout_s=30)
        if res.returncode != 0:
            raise ClusterError(f"host {spec.name}: {(res.stderr.strip().splitlines() or ['check failed'])[-1]}")
        conn.get_tree(attempt["path"], Path(local_dir))
        attempt["fetched"].add(spec.name)
        conn.run_line(command_line(["rm", "-rf", "--", attempt["path"]]), timeout_s=60)

    def rank_out_dir(self, out_dir: Path, trial_id: str) -> PurePosixPath:
        """Where ranks write their records on the hosts (fetched into `out_dir` afterwards): a fresh directory per
        attempt, `<testbed_run_dir>/tb-<cluster>.<random>`, made private on each host when the first process of the
        attempt starts there (`_make_attempt_dir`) and removed by `fetch`. Nothing is made on the hosts here
        (`run --dry-run` calls it)."""
        first = next(iter(self.specs.values()))
        path = self._run_parent(first) / f"tb-{self.name}.{secrets.token_hex(8)}"
        self._attempt = {"path": str(path), "made": set(), "fetched": set()}
        return path

    def _make_attempt_dir(self, spec: LabHostSpec) -> None:
        """Make the current attempt's directory on this host (once): private, fresh name, checked with lstat. An
        existing directory passes only if it is the login user's and private: another user cannot make one that is,
        and the hosts may share the run directory."""
        attempt = self._attempt
        if attempt is None or spec.name in attempt["made"]:
            return
        path = PurePosixPath(attempt["path"])
        line = private_dir_line(path.parent, path.name, reuse_own=True)
        res = self._conn(spec.name).run_line(line, timeout_s=30)
        if res.returncode != 0:
            raise LaunchError(f"host {spec.name}: {(res.stderr.strip().splitlines() or ['mkdir failed'])[-1]}")
        attempt["made"].add(spec.name)

    def links(self, hosts: list[Host] | None = None) -> list[tuple[Host, str, str | None, str]]:
        """(host, direction, netns, ifname): upload is the data NIC's egress, download the egress of its ifb."""
        from shaping.ingress import ifb_name

        out = []
        for h in hosts or self.hosts():
            out.append((h, "upload", None, h.data_iface))
            out.append((h, "download", None, ifb_name(h.data_iface)))
        return out

    def recorded_shape(self) -> LinkShape | None:
        """The shaping `testbed up --bw` put on the whole cluster (restored after each trial), if any."""
        s = (self.record or {}).get("shape")
        return LinkShape.from_dict(s) if s else None

    # ------------------------------------------------------------------------------------------------- checks
    def probe(self, name: str) -> dict[str, Any]:
        """Facts of one host: Python, torch/NCCL versions, GPUs, data NIC (exists, speed, addresses), shaping."""
        spec = self.specs[name]
        res = self._conn(name).run(
            [spec.python, "-c", HOST_FACTS, spec.data_iface], cwd=spec.project_dir, timeout_s=120
        )
        if res.returncode != 0 or not res.stdout.strip():
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            if res.returncode == 127 or "not found" in last or "No such file" in last:
                raise ClusterError(
                    f"host {name}: {spec.python} (testbed_python) or {spec.project_dir} "
                    f"(testbed_project_dir) not found: {last}"
                )
            raise ClusterError(f"host {name}: probing with {spec.python} failed: {last}")
        try:
            facts = json.loads(res.stdout.strip().splitlines()[-1])
        except ValueError:
            raise ClusterError(f"host {name}: unexpected probe output {res.stdout[-200:]!r}") from None
        self.facts[name] = facts
        return facts

    def check(self, rate_bps: int | None = None) -> dict[str, dict[str, Any]]:
        """Probe every host and raise one line naming every problem: unreachable host, wrong key, unknown host key,
        missing data interface, Python too old, missing GPUs (unless allow_cpu), NIC slower than `rate_bps`, hosts
        whose torch/CUDA/NCCL/driver versions disagree."""
        results = self._each(self.probe, list(self.specs))
        problems: list[tuple[type[TestbedError], str]] = []
        for name, r in results.items():
            if isinstance(r, TestbedError):
                problems.append((type(r), str(r)))
            else:
                problems += evaluate_facts(self.specs[name], r, rate_bps=rate_bps, allow_cpu=self.allow_cpu)
        reached = {n: r for n, r in results.items() if not isinstance(r, TestbedError)}
        problems += [(ClusterError, m) for m in version_disagreements(reached)]
        if problems:
            kinds = {k for k, _ in problems}
            cls = (
                InputError
                if kinds == {InputError}
                else ClusterError
                if ClusterError in kinds or len(kinds) > 1
                else next(iter(kinds))
            )
            raise cls("; ".join(m for _, m in problems))
        return results

    def provision(
        self, run_playbook: bool = True, *, extra_vars: dict[str, Any] | None = None, rate_bps: int | None = None
    ) -> dict[str, dict[str, Any]]:
        """Run ansible/playbooks/provision.yml against the inventory (after checking every host is reachable with a
        known key), then `check()`. Returns the facts of each host."""
        if run_playbook:
            reach = self._each(lambda n: self._conn(n).connect() and True, list(self.specs))
            errors = [str(r) for r in reach.values() if isinstance(r, TestbedError)]
            if errors:
                raise ClusterError("; ".join(errors))
            self.run_playbook("provision.yml", extra_vars=extra_vars)
        return self.check(rate_bps=rate_bps)

    def run_playbook(
        self, playbook: str, *, extra_vars: dict[str, Any] | None = None, timeout_s: float = 1800
    ) -> subprocess.CompletedProcess:
        if self.inventory_path is None:
            raise InputError("running a playbook needs the cluster's inventory file")
        exe = Path(sys.executable).parent / "ansible-playbook"
        exe = str(exe) if exe.exists() else shutil.which("ansible-playbook")
        if not exe:
            raise ClusterError("ansible-playbook not found; install ansible-core (pip install 'ansible-core<2.21')")
        env = dict(os.environ)
        env.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible" / "ansible.cfg"))
        env.pop("ANSIBLE_HOST_KEY_CHECKING", None)  # host keys are always checked (the config says so)
        if self.accept_new_host_keys:  # trust on first use; a CHANGED key is still refused (OpenSSH's accept-new)
            env["ANSIBLE_SSH_ARGS"] = accept_new_ssh_args(env)
        with tempfile.TemporaryDirectory(prefix="testbed-provision-") as private:  # mode 0700, removed after the run
            # what the role installs on the hosts: the package files only, packed where no other user can read
            source = stage_source(Path(private) / "src")
            ours = {"testbed_host_source_dir": str(source),
                    "testbed_host_source_archive": str(Path(private) / "testbed-src.tar.gz")}  # fmt: skip
            argv = [exe, "-i", str(self.inventory_path), str(REPO / "ansible" / "playbooks" / playbook)]
            argv += ["-e", json.dumps({**ours, **(extra_vars or {})})]
            res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, umask=0o077)
        if res.returncode != 0:
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("fatal:", "failed:", "ERROR"))]
            lines += [ln for ln in res.stderr.splitlines() if ln.strip()]
            raise ClusterError(f"ansible-playbook {playbook} failed: {(lines or ['see its output'])[0][:400]}")
        return res

    # ------------------------------------------------------------------------------------------------ shaping
    def shaping_peers(self, host: Host | str) -> tuple[str, ...]:
        """What this host's shaping classifies as the cluster's data traffic: `testbed_shaping_peers` when the
        inventory sets it, else the other hosts' data addresses (storage, the scheduler, other tenants on the same
        NIC pass unshaped)."""
        from shaping.classify import parse_peers

        spec = self._spec(host)
        if spec.shaping_peers is not None:
            return spec.shaping_peers
        others = [h.address for h in self.hosts() if h.name != spec.name]
        return parse_peers(others) if others else ()

    def _peer_flags(self, name: str) -> list[str]:
        """The per-host flags of `python -m shaping apply`: the classifier and, when the inventory asks, offload."""
        peers = self.shaping_peers(name)
        spec = self._spec(name)
        offload = ["--offload", spec.shaping_offload] if spec.shaping_offload != "off" else []
        return (["--peers", ",".join(peers)] if peers else []) + offload

    def _shaping_argv(self, spec: LabHostSpec, *args: str) -> list[str]:
        """`python -m shaping ARGS` as the login user (root), or with `ansible_become` the root-owned helper through
        `sudo -n` (never a password prompt: a missing sudoers rule fails at once, naming sudo)."""
        if spec.become:
            return ["sudo", "-n", spec.shaping_helper, *args]
        return [spec.python, "-m", "shaping", *args]

    def _names(self, hosts: list[Host] | list[str] | None) -> list[str]:
        if hosts is None:
            return list(self.specs)
        return [self._spec(h).name for h in hosts]

    def apply_shaping(
        self,
        shape: LinkShape,
        hosts: list[Host] | None = None,
        *,
        force: bool = False,
        force_mgmt_iface: bool = False,
        ingress: bool = True,
        confirm_within_s: float = DEFAULT_CONFIRM_WITHIN_S,
    ) -> list[dict]:
        """Shape each host's data NIC (egress, and ingress via ifb unless ingress=False), commit-confirmed: applied
        host by host with a dead-man timer, then confirmed over fresh SSH connections. Any failure rolls every host
        back to its previous shaping and raises. Returns the applied plan of each host."""
        names = self._names(hosts)
        args = [*shape.to_flags(), "--confirm-within", f"{confirm_within_s:g}", "--json"]
        args += ["--ingress"] * ingress + ["--force"] * force + ["--force-mgmt-iface"] * force_mgmt_iface
        applied: list[str] = []
        results = []
        try:
            for n in names:
                spec = self.specs[n]
                host_args = args if spec.shaping_ingress else [a for a in args if a != "--ingress"]
                argv = self._shaping_argv(spec, "apply", "--dev", spec.data_iface, *host_args, *self._peer_flags(n))
                res = self.run(n, argv, timeout_s=120)
                if res.returncode != 0:
                    msg = f"host {n}: {(res.stderr.strip().splitlines() or ['shaping failed'])[-1].removeprefix('error: ')}"
                    raise (InputError if res.returncode == 2 else ShapingError)(msg)
                applied.append(n)
                results.append({"host": n, **json.loads(res.stdout.strip().splitlines()[-1])})
            for n in names:  # a *new* connection proves the host is still reachable with the new shaping
                spec = self.specs[n]
                fresh = self._fresh_conn(n)
                try:
                    res = fresh.run(
                        self._shaping_argv(spec, "confirm", "--dev", spec.data_iface, "--json"),
                        cwd=spec.project_dir,
                        timeout_s=60,
                    )
                except (TestbedError, subprocess.TimeoutExpired) as e:
                    raise ShapingError(
                        f"host {n}: unreachable over a new {self.transport} connection after shaping ({e}); rolled back"
                    ) from None
                finally:
                    fresh.close()
                if res.returncode != 0:
                    raise ShapingError(f"host {n}: confirming shaping failed: {res.stderr.strip()}")
                applied.remove(n)
        except BaseException:
            for n in applied:  # still pending: restore now rather than wait for the timer
                spec = self.specs[n]
                try:
                    self.run(n, self._shaping_argv(spec, "rollback", "--dev", spec.data_iface), timeout_s=60)
                except (TestbedError, subprocess.TimeoutExpired):
                    pass  # the host's own timer restores it at the deadline
            raise
        if hosts is None:
            self._record_shape(shape.to_dict())
        return results

    def end_leftover(self, handle: dict[str, Any]) -> bool:
        """A killed controller's rank or iperf3 server on a lab host: its process group, only while the leader still
        carries the token it was started with (kill_group_script checks; a reused pid is left alone)."""
        pgid, token = handle.get("pgid"), str(handle.get("token") or "")
        if not isinstance(pgid, int) or pgid <= 1 or not re.fullmatch(r"[A-Za-z0-9_.-]+-[0-9a-f]{12}", token):
            return False
        self._conn(str(handle["host"])).run_line(kill_group_script(pgid, token, 3.0), timeout_s=40)
        return True

    def _record_shape(self, shape: dict[str, Any] | None) -> None:
        """Shaping put on (or cleared from) every host becomes the cluster's recorded shaping, as on the local
        backend: what `status` reports and each trial restores. Nothing is recorded while `up` builds the record."""
        if self.record is not None and registry.load_record(self.name) is not None:
            self.record["shape"] = shape
            registry.save_record(self.name, self.record)

    def clear_shaping(self, hosts: list[Host] | None = None) -> None:
        def clear(n: str) -> None:
            spec = self.specs[n]
            res = self.run(n, self._shaping_argv(spec, "clear", "--dev", spec.data_iface, "--json"), timeout_s=60)
            if res.returncode != 0:
                raise ShapingError(f"host {n}: clearing shaping failed: {res.stderr.strip()}")

        errors = [str(r) for r in self._each(clear, self._names(hosts)).values() if isinstance(r, TestbedError)]
        if errors:
            raise ShapingError("; ".join(errors))
        if hosts is None:
            self._record_shape(None)

    def shaping(self, host: Host | str) -> dict[str, Any]:
        spec = self._spec(host)
        res = self.run(spec.name, self._shaping_argv(spec, "show", "--dev", spec.data_iface, "--json"), timeout_s=60)
        if res.returncode != 0:
            raise ShapingError(f"host {spec.name}: reading shaping failed: {res.stderr.strip()}")
        return json.loads(res.stdout.strip().splitlines()[-1])

    # ------------------------------------------------------------------------------------------- status / down
    def status(self) -> dict[str, Any]:
        facts = self._each(self.probe, list(self.specs))
        hosts = []
        for h in self.hosts():
            f = facts[h.name]
            row: dict[str, Any] = {
                "name": h.name,
                "address": h.address,
                "data_iface": h.data_iface,
                "netns": None,
                **self._where(h.name),
            }
            if isinstance(f, TestbedError):
                row.update(reachable=False, error=str(f), links={})
            else:
                sh = f.get("shaping") or {}
                ing = (sh.get("ingress") or {}).get("shaping") or {}
                row.update(
                    reachable=True,
                    peers=(sh.get("egress") or {}).get("peers") or [],
                    gpus=f.get("gpus", 0),
                    nic_speed_mbps=f.get("nic_speed_mbps"),
                    python=".".join(map(str, f.get("python", []))),
                    torch=f.get("torch"),
                    cuda=f.get("cuda"),
                    nccl=f.get("nccl"),
                    driver=f.get("driver_version"),
                    gpu_name=f.get("gpu_name"),
                    links={
                        "upload": {"ifname": h.data_iface, **(sh.get("egress") or {})},
                        "download": {"ifname": (sh.get("ingress") or {}).get("ifb"), **ing},
                    },
                )
            hosts.append(row)
        return {
            "name": self.name,
            "backend": self.backend,
            "inventory": str(self.inventory_path) if self.inventory_path else None,
            "shape": (self.record or {}).get("shape"),
            "hosts": hosts,
        }

    def down(self) -> str:
        """Clear shaping on every host and end every rank process group started for this cluster (also by other
        controller processes: their pid files on the hosts are checked against a token before signalling); forget
        the cluster's record when it was opened from one."""
        self.kill_started()

        def host_down(n: str) -> None:
            spec = self.specs[n]
            script = end_processes_script(self._run_parent(spec), self.name, n)
            self._conn(n).run_line(script, timeout_s=120)
            # --forget: also end a dead-man timer still waiting and remove the commit-confirm state directory
            argv = self._shaping_argv(spec, "clear", "--dev", spec.data_iface, "--forget", "--json")
            res = self.run(n, argv, timeout_s=60)
            if res.returncode != 0:
                raise ShapingError(f"host {n}: clearing shaping failed: {res.stderr.strip()}")

        errors = [str(r) for r in self._each(host_down, list(self.specs)).values() if isinstance(r, TestbedError)]
        if not errors:  # the attempts' directories left by trials that failed before fetching (private, the user's)
            pattern = f"{self._run_parent(next(iter(self.specs.values())))}/tb-{self.name}."
            sweep = {n: f"u=$(id -u); for d in {shlex.quote(pattern)}*; do {_own_dir_test('$d')} && rm -rf -- \"$d\"; "
                     "done; true" for n in self.specs}  # fmt: skip
            self._each(lambda n: self._conn(n).run_line(sweep[n], timeout_s=120), list(self.specs))
        self.close()
        if errors:
            raise ClusterError("; ".join(errors))
        if self.record is not None:
            registry.delete_record(self.name)
        return "lab shaping cleared, rank processes ended"


def command_for(argv: list[str]) -> str:
    """The quoted command line lab hosts run for argv (exposed for tests and --dry-run output)."""
    return command_line(argv)
