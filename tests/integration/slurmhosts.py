"""Fixture: a real Slurm (Debian's slurmctld, slurmd and munge) on the namespaced lab hosts of labhosts.py.

    root ns: munged (own key, socket, pid and log under tmp)       one socket file: every namespace shares the
             slurmctld (own UTS namespace, hostname tbctl-XXXX,    filesystem, so all daemons and clients use it
             listening on the controller's mgmt address)
    tbl-XXXX-hN: slurmd in the host's netns and its own UTS namespace (hostname tbnXXXXN = its NodeName; Debian's
             build has no --enable-multiple-slurmd), NodeAddr = the host's mgmt0 address

Clients run anywhere with SLURM_CONF pointing at the generated slurm.conf: from the root namespace (sbatch, squeue,
scancel in the test) slurmctld is local; from a node (srun inside a batch script, i.e. `testbed up --slurm`) it is
reached over mgmt0, and the node's slurmd/slurmstepd connect back to srun's listening ports over mgmt0 as well.
Ranks talk over data0, the shaped NIC. The Epilog and Prolog are the testbed_host role's scripts rendered into tmp.

Teardown kills every daemon by PID (munged, slurmctld; slurmd and anything else in the namespaces through
labhosts' teardown) even when the test failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from labhosts import LabHosts, create_lab_hosts, wait_for

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class SlurmLab:
    lab: LabHosts
    conf: Path
    nodes: dict[str, str]  # lab host name -> Slurm NodeName
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def slurm(self, *argv: str, timeout_s: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout_s, check=check)

    def node_states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def job_state(self, job_id: str) -> str:
        out = self.slurm("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()
        if out:
            return out
        out = self.slurm("scontrol", "show", "job", job_id).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def teardown(self) -> list[str]:
        sessions = {p.pid for p in self.procs}
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for pid in _in_sessions(sessions):  # helpers a daemon forked into another group (slurmctld's slurmscriptd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not _in_sessions(sessions), 10, "the Slurm daemons' helpers to exit", 0.1)
        return self.lab.teardown()  # slurmd, slurmstepd, ranks: every process in the namespaces, then the namespaces


# slurmd in the host's netns, its own UTS namespace (hostname = NodeName) and its own mount namespace: a sysfs of that
# netns on /sys (what `ip netns exec` does: steps and the Epilog then see the host's NICs in /sys/class/net) with this
# machine's cgroup mounts carried over onto it (slurmd 22.05 fails to start without a cgroup filesystem).
SLURMD_SH = (
    'mount --rbind /sys/fs/cgroup "$3" && mount -t sysfs sysfs /sys && mount --rbind "$3" /sys/fs/cgroup && '
    'umount -l "$3" && hostname "$1" && exec slurmd -D -f "$2"'
)


def _in_sessions(sessions: set[int]) -> list[int]:
    """Processes whose session id is one of `sessions` (every daemon here was started in a session of its own)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) in sessions:
                    out.append(int(entry))
    return out


def _start(argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def create_slurm_lab(tmp: Path, *, n_hosts: int = 2, prepare=None) -> SlurmLab:
    """Namespaced hosts plus munged, slurmctld and one slurmd per host, all idle and ready. Call `.teardown()`.
    `prepare(slurm_lab)`, called once the hosts exist and before any Slurm daemon starts, returns the (prolog,
    epilog) scripts for slurm.conf (None: none)."""
    lab = create_lab_hosts(tmp, n_hosts=n_hosts)
    sfx = lab.suffix
    nodes = {h.name: f"tbn{sfx}{i}" for i, h in enumerate(lab.hosts)}
    sl = SlurmLab(lab=lab, conf=tmp / "slurm" / "slurm.conf", nodes=nodes)
    try:
        prolog, epilog = prepare(sl) if prepare else (None, None)
        _build(sl, tmp / "slurm", epilog=epilog, prolog=prolog)
    except BaseException:
        sl.teardown()
        raise
    return sl


def _build(sl: SlurmLab, d: Path, *, epilog: Path | None, prolog: Path | None) -> None:
    lab = sl.lab
    d.mkdir(mode=0o755)  # munged wants execute permission for all on its socket's directory
    (d / "state").mkdir()
    (d / "spool").mkdir()
    os.chmod(d.parent, 0o755)  # munged refuses a key or socket below a group/other-writable directory
    key, sock = d / "munge.key", d / "munge.sock"
    subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
    os.chmod(key, 0o600)
    sl.procs.append(
        _start(
            ["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
             f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"],  # fmt: skip
            d / "munged.out",
        )
    )
    wait_for(lambda: sock.exists() or sl.procs[0].poll() is not None, 20, "munged's socket")
    if not sock.exists():
        raise RuntimeError(f"munged exited: {(d / 'munged.out').read_text()[-800:]}")

    ctl_host = f"tbctl-{lab.suffix}"
    ctld_port, slurmd_port = _free_port(), _free_port()
    cpus = max(2, os.cpu_count() or 2)
    lines = [
        f"ClusterName=tb{lab.suffix}",
        f"SlurmctldHost={ctl_host}({lab.controller_addr})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d}/slurmd-%n.pid",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=300",
        "SlurmdTimeout=60",
        "SlurmctldTimeout=60",
        "MessageTimeout=30",
        *([f"Epilog={epilog}"] if epilog else []),
        *([f"Prolog={prolog}"] if prolog else []),
    ]
    for h in lab.hosts:
        lines.append(f"NodeName={sl.nodes[h.name]} NodeAddr={h.mgmt_addr} CPUs={cpus * 2} RealMemory=1 State=UNKNOWN")
    lines.append("PartitionName=tb Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO")
    sl.conf.write_text("\n".join(lines) + "\n")
    (d / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")

    sl.procs.append(
        _start(
            ["unshare", "--uts", "sh", "-c", 'hostname "$1" && exec slurmctld -D -i -f "$2"', "sh", ctl_host,
             str(sl.conf)],  # fmt: skip
            d / "slurmctld.out",
        )
    )
    for h in lab.hosts:
        node = sl.nodes[h.name]
        (d / "spool" / node).mkdir()
        (d / f"cg-{node}").mkdir()
        sl.procs.append(
            _start(
                ["nsenter", f"--net=/run/netns/{h.ns}", "unshare", "--mount", "--uts", "--propagation", "private",
                 "sh", "-c", SLURMD_SH, "sh", node, str(sl.conf), str(d / f"cg-{node}")],  # fmt: skip
                d / f"slurmd-{node}.out",
            )
        )

    def ready() -> bool:
        dead = [p for p in sl.procs if p.poll() is not None]
        if dead:
            return True
        states = sl.node_states()
        return len(states) == len(lab.hosts) and all(s == "idle" for s in states.values())

    wait_for(ready, 60, "every slurmd to report idle", interval_s=0.5)
    dead = [p for p in sl.procs if p.poll() is not None]
    if dead:
        logs = {f.name: f.read_text()[-600:] for f in sorted(d.glob("*.out")) + sorted(d.glob("*.log"))}
        raise RuntimeError(f"a Slurm daemon exited: {dead[0].args}: {logs}")


def new_name(prefix: str = "tbs") -> str:
    return prefix + secrets.token_hex(3)
