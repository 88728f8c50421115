"""Fixture: lab hosts you can SSH into, on one machine. Each is a network namespace running its own sshd.

Topology (names carry a random suffix so parallel runs and a user's clusters never collide)::

    root ns (the controller)            tbl-XXXX-sw                      tbl-XXXX-hN
    tblXXXXc 10.A.B.254 ---veth--- ctl -[mgmtbr]- mN ---veth--- mgmt0 10.A.B.(N+1)   <- sshd listens here
                                          [databr]- dN ---veth--- data0 10.A.C.(N+1)  <- the NIC to shape

Two NICs per host like a real lab machine: SSH arrives on mgmt0 (so lockout protection has something to protect) and
training/probes use data0. sshd: root login by key only, a generated client key, one ed25519 host key per host and a
generated known_hosts. Everything the fixture starts (sshd, and any process found in its namespaces: sessions,
dead-man timers, ranks, iperf3) is killed by PID in teardown, then the namespaces (and so every veth) are deleted
and the shaping state directories of those namespaces removed. Teardown runs even when the test failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import random_suffix

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SSHD = "/usr/sbin/sshd"
PREFIX = "tbl-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll `predicate` until it returns a truthy value or the deadline passes (then AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def _ns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode and int(entry) != os.getpid():
                    out.append(int(entry))
    return out


def _free_subnets() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """Two random /24s in 10.0.0.0/8 that no route of this machine's root namespace overlaps."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all").stdout or "[]")
    used = []
    for r in routes:
        dst = r.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    for _ in range(100):
        a, b = secrets.randbelow(150) + 100, secrets.randbelow(127) * 2
        nets = (ipaddress.ip_network(f"10.{a}.{b}.0/24"), ipaddress.ip_network(f"10.{a}.{b + 1}.0/24"))
        if not any(n.overlaps(u) for n in nets for u in used if u.prefixlen > 0):
            return nets
    raise RuntimeError("no free 10.x.y.0/24 subnet pair found")


@dataclasses.dataclass
class LabTestHost:
    name: str
    ns: str
    mgmt_addr: str
    data_addr: str
    mgmt_iface: str = "mgmt0"
    data_iface: str = "data0"
    host_key_pub: str = ""
    sshd: subprocess.Popen | None = None


@dataclasses.dataclass
class LabHosts:
    suffix: str
    tmp: Path
    hosts: list[LabTestHost]
    controller_addr: str
    controller_iface: str
    client_key: Path
    known_hosts: Path
    switch_ns: str
    inodes: dict[str, int] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------------------------------- inventory helpers
    def host_vars(self, h: LabTestHost) -> dict:
        return {"ansible_host": h.mgmt_addr, "testbed_data_address": h.data_addr}

    def inventory(self, **group_vars) -> dict:
        vars_ = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_python_interpreter": PYTHON,
            "testbed_data_iface": "data0",
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes -o ConnectTimeout=10"
            ),
            "testbed_python": PYTHON,
            "testbed_project_dir": str(REPO),
            "testbed_gpus_per_host": 0,
            "testbed_run_dir": str(self.tmp / "run"),
            "testbed_host_install_packages": False,
            "testbed_host_install_project": False,
            "testbed_host_nccl_env_path": str(self.tmp / "etc" / "{{ inventory_hostname }}-nccl.env"),
            "testbed_host_require_time_sync": False,
            "testbed_shaping_helper": str(self.tmp / "bin" / "testbed-shaping"),  # not /usr/local/sbin of this machine
        }
        vars_.update(group_vars)
        return {
            "all": {"children": {"testbed": {"hosts": {h.name: self.host_vars(h) for h in self.hosts}}}, "vars": vars_}
        }

    def write_inventory(self, name: str = "inventory.yml", inventory: dict | None = None, **group_vars) -> Path:
        import yaml

        path = self.tmp / name
        path.write_text(yaml.safe_dump(inventory or self.inventory(**group_vars), sort_keys=False))
        return path

    def ansible_env(self) -> dict[str, str]:
        env = dict(os.environ)
        home = self.tmp / "ansible-home"
        env.update(
            ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"),
            ANSIBLE_HOME=str(home),
            ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(home / "cp"),
            ANSIBLE_REMOTE_TEMP=str(self.tmp / "ansible-remote"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            PATH=f"{Path(PYTHON).parent}:{env.get('PATH', '')}",
        )
        return env

    def netns_exec(self, h: LabTestHost, *argv: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", h.ns, *argv], **kw)

    def ssh_ok(self, h: LabTestHost) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((h.mgmt_addr, 22), timeout=0.5) as s:
            return s.recv(4).startswith(b"SSH")
        return False

    # ---------------------------------------------------------------------------------------------------- teardown
    def teardown(self) -> list[str]:
        problems = []
        for h in self.hosts:  # the sshd we started: its whole group
            if h.sshd is not None and h.sshd.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(h.sshd.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    h.sshd.wait(timeout=5)
        for ns, inode in self.inodes.items():  # anything else running in our namespaces (timers, ranks, iperf3)
            for pid in pids_in_netns(inode):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(AssertionError):
                wait_for(lambda inode=inode: not pids_in_netns(inode), 5, f"processes in {ns} to exit")
            shutil.rmtree(f"/run/testbed-shaping/netns-{inode}", ignore_errors=True)
        for ns in list(self.inodes):
            r = _ip("netns", "del", ns, check=False)
            if r.returncode != 0 and "No such file" not in r.stderr:
                problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
        if _ip("link", "show", self.controller_iface, check=False).returncode == 0:
            _ip("link", "del", self.controller_iface, check=False)
        return problems


def create_lab_hosts(tmp: Path, n_hosts: int = 3) -> LabHosts:
    """Create `n_hosts` namespaced SSH hosts under `tmp`. Call `.teardown()` (the pytest fixture does)."""
    if os.geteuid() != 0:
        raise PermissionError("lab hosts need root")
    suffix = random_suffix(4)  # noted for the suite's leak guard
    mgmt_net, data_net = _free_subnets()
    mgmt_hosts, data_hosts = list(mgmt_net.hosts()), list(data_net.hosts())
    sw = f"{PREFIX}{suffix}-sw"
    lab = LabHosts(
        suffix=suffix,
        tmp=tmp,
        hosts=[],
        controller_addr=str(mgmt_hosts[-1]),
        controller_iface=f"tbl{suffix}c",
        client_key=tmp / "id_client",
        known_hosts=tmp / "known_hosts",
        switch_ns=sw,
    )
    try:
        _build(lab, n_hosts, mgmt_net, mgmt_hosts, data_hosts)
    except BaseException:
        lab.teardown()
        raise
    return lab


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, capture_output=True
    )
    return Path(f"{path}.pub").read_text().strip()


def _build(lab: LabHosts, n_hosts: int, mgmt_net, mgmt_hosts, data_hosts) -> None:
    tmp, sw, sfx = lab.tmp, lab.switch_ns, lab.suffix
    _ip("netns", "add", sw)
    lab.inodes[sw] = _ns_inode(sw)
    for br in ("mgmtbr", "databr"):
        _ip("-n", sw, "link", "add", br, "type", "bridge")
        _ip("-n", sw, "link", "set", br, "up")
    _ip("link", "add", lab.controller_iface, "type", "veth", "peer", "name", "ctl", "netns", sw)
    _ip("-n", sw, "link", "set", "ctl", "master", "mgmtbr", "up")
    _ip("addr", "add", f"{lab.controller_addr}/{mgmt_net.prefixlen}", "dev", lab.controller_iface)
    _ip("link", "set", lab.controller_iface, "up")

    pub = _keygen(lab.client_key, "tbl-client")
    (tmp / "authorized_keys").write_text(pub + "\n")
    os.chmod(tmp / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    known = []
    for i in range(n_hosts):
        ns = f"{PREFIX}{sfx}-h{i}"
        h = LabTestHost(name=f"h{i}", ns=ns, mgmt_addr=str(mgmt_hosts[i]), data_addr=str(data_hosts[i]))
        lab.hosts.append(h)
        _ip("netns", "add", ns)
        lab.inodes[ns] = _ns_inode(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        for iface, port, br, addr in (
            ("mgmt0", f"m{i}", "mgmtbr", h.mgmt_addr),
            ("data0", f"d{i}", "databr", h.data_addr),
        ):
            _ip("-n", ns, "link", "add", iface, "type", "veth", "peer", "name", port, "netns", sw)
            _ip("-n", sw, "link", "set", port, "master", br, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
        hdir = tmp / h.name
        hdir.mkdir()
        h.host_key_pub = _keygen(hdir / "ssh_host_ed25519_key", f"tbl-{h.name}")
        known.append(f"{h.mgmt_addr} {' '.join(h.host_key_pub.split()[:2])}")
        cfg = hdir / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    "Port 22",
                    f"ListenAddress {h.mgmt_addr}",
                    f"HostKey {hdir / 'ssh_host_ed25519_key'}",
                    "PidFile none",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
                    "StrictModes no",
                    "UsePAM no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "LogLevel ERROR",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        log = open(hdir / "sshd.log", "wb")
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(cfg), "-h", str(hdir / "ssh_host_ed25519_key")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
    lab.known_hosts.write_text("\n".join(known) + "\n")
    for h in lab.hosts:
        wait_for(lambda h=h: h.sshd.poll() is not None or lab.ssh_ok(h), 20, f"sshd of {h.name}")
        if h.sshd.poll() is not None:
            raise RuntimeError(f"sshd of {h.name} exited: {(tmp / h.name / 'sshd.log').read_text()[-500:]}")
