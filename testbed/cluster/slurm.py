"""Slurm backend: the nodes of a running Slurm allocation, reached through `srun` steps instead of SSH.

`testbed up --slurm` runs inside an allocation (salloc or an sbatch script): the hosts are the allocation's nodes
(`scontrol show hostnames $SLURM_JOB_NODELIST`), the data NIC comes from `--iface` or the inventory's
`testbed_data_iface`. Everything the lab backend does on a host goes through one primitive, a job step on that node::

    srun --jobid JOB --overlap --nodes 1 --ntasks 1 -w NODE --job-name tb-CLUSTER-TOKEN ... /bin/sh -c LINE

so host facts, shaping (commit-confirmed, as on lab hosts), the iperf3 probe and fetching results reuse
LabCluster's code unchanged (`SrunConnection` offers the SSHConnection methods it calls). Ranks are one srun step
each, watched through the local srun's exit and ended with `scancel --signal=TERM JOB.STEP`, then KILL: the
scheduler's own launcher, with its process tracking, cleanup and accounting. When the job ends however it ends
(scancel, time limit, node failure), slurmd ends every step; the testbed_host role's Epilog clears the shaping.

Shaping needs root: as a normal user it runs `sudo -n <testbed_shaping_helper>` (the role installs the helper and a
sudoers rule for it); as root the helper runs directly when the nodes come from an inventory (provisioned by the
role), else `python -m shaping`.
Without an inventory the hosts use this controller's Python and checkout (a shared filesystem, as on most clusters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from shaping.plan import LinkShape
from testbed.cluster import registry
from testbed.cluster.base import Host, RankProcess
from testbed.cluster.lab.cluster import LabCluster
from testbed.cluster.lab.inventory import DEFAULT_RUN_DIR, LabHostSpec, load_inventory
from testbed.cluster.ssh import SSHTarget, command_line
from testbed.errors import ClusterError, InputError, LaunchError, TestbedError

REPO = Path(__file__).resolve().parents[2]
NOT_IN_ALLOCATION = (
    "--slurm: not inside a Slurm allocation (SLURM_JOB_ID unset); run it under salloc or sbatch"
)
# What a step's task sees of this controller's environment: a login-like minimum (the rank's own variables travel in
# srun's environment, exported by name); `--export` without ALL means only these plus Slurm's SLURM_* variables.
STEP_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ALIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise ClusterError(f"{name} not found on PATH; the Slurm backend needs the Slurm client tools (slurm-client)")
    return path


def client_env() -> dict[str, str]:
    """The environment of srun/squeue/scancel run by the testbed: this one without the allocation's SLURM_* inputs
    (an sbatch script's SLURM_NTASKS_PER_NODE, SLURM_CPUS_PER_TASK ... would override the one-task steps); the job is
    always named with --jobid. SLURM_CONF stays."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def allocation_nodes(job_id: str, nodelist: str) -> list[str]:
    """The allocation's node names, expanded by `scontrol show hostnames` (the one parser of Slurm's ranges)."""
    res = subprocess.run(
        [_tool("scontrol"), "show", "hostnames", nodelist], capture_output=True, text=True, env=client_env(), timeout=30
    )
    names = res.stdout.split()
    if res.returncode != 0 or not names:
        raise ClusterError(f"scontrol show hostnames {nodelist!r} failed: {res.stderr.strip() or 'no nodes'}")
    return names


def job_state(job_id: str) -> tuple[str | None, str]:
    """(state, detail) of a Slurm job: state None when the controller no longer knows it."""
    res = subprocess.run(
        [_tool("squeue"), "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, env=client_env(), timeout=30
    )
    state = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None
    return state, (res.stderr.strip().splitlines() or [""])[-1]


def _clean_stderr(stderr: str) -> str:
    """srun adds its own lines ("srun: error: n1: task 0: Exited with exit code 2"); drop them when the task wrote
    something itself, so callers see the task's last line as on SSH."""
    lines = stderr.splitlines()
    own = [ln for ln in lines if not ln.startswith("srun: ")]
    return "\n".join(own) + ("\n" if own else "") if own else stderr


# ---------------------------------------------------------------------------------------------- one node's steps
class SrunConnection:
    """What LabCluster calls on an SSHConnection (run_line, run, get_file, get_tree, connect, close), as job steps on
    one node of the allocation."""

    def __init__(self, cluster: SlurmCluster, node: str):
        self.cluster, self.node = cluster, node

    def srun_argv(self, step_name: str, env_names: tuple[str, ...] = ()) -> list[str]:
        """`env_names`: variables the step gets from srun's own environment (named here, their values never on a
        command line, which every user of this machine can read)."""
        bad = [n for n in env_names if not _ENV_NAME.match(n)]
        if bad:
            raise InputError(f"environment variable name {bad[0]!r} is not valid; expected [A-Za-z_][A-Za-z0-9_]*")
        export = f"PATH={STEP_PATH}"
        home = os.environ.get("HOME", "")
        if home and "," not in home:
            export += f",HOME={home}"
        export += "".join(f",{n}" for n in env_names)
        return [
            _tool("srun"), "--jobid", self.cluster.job_id, "--overlap", "--nodes", "1", "--ntasks", "1",
            "-w", self.node, "--job-name", step_name, "--quiet", "--chdir", "/", f"--export={export}",
        ]  # fmt: skip

    def connect(self) -> SrunConnection:
        self.cluster.require_allocation()
        return self

    def close(self) -> None:
        pass

    def run_line(
        self,
        line: str,
        *,
        timeout_s: float = 60.0,
        stdin: bytes | None = None,
        text: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """`line` as a step on the node; `env` reaches it through srun's environment (see srun_argv)."""
        self.cluster.require_allocation()
        name = self.cluster.step_name()
        env = env or {}
        argv = [*self.srun_argv(name, tuple(env)), "/bin/sh", "-c", line]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**client_env(), **env},
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.cluster.cancel_step(name, proc)
            raise subprocess.TimeoutExpired(line, timeout_s) from None
        err_text = _clean_stderr(err.decode(errors="replace"))
        return subprocess.CompletedProcess(line, proc.returncode, out.decode(errors="replace") if text else out, err_text)

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess:
        res = self.run_line(command_line(argv, cwd=cwd), timeout_s=timeout_s, env=env)
        res.args = list(argv)
        return res

    def get_file(self, remote: str, local: Path) -> None:
        res = self.run_line(command_line(["cat", remote]), timeout_s=120, text=False)
        if res.returncode != 0:
            raise ClusterError(f"host {self.node}: cannot read {remote}: {res.stderr.strip()}")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(res.stdout)

    def get_tree(self, remote_dir: str, local_dir: Path) -> int:
        """Copy a directory of the node here (tar through a step); returns the number of files copied."""
        res = self.run_line(command_line(["tar", "-C", remote_dir, "-cf", "-", "."]), timeout_s=600, text=False)
        if res.returncode != 0:
            raise ClusterError(f"host {self.node}: no directory {remote_dir} to fetch ({res.stderr.strip()})")
        local_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
            files = [m for m in tar.getmembers() if m.isfile()]
            tar.extractall(local_dir, filter="data")
        return len(files)


# --------------------------------------------------------------------------------------------------- rank steps
class SrunRankProcess(RankProcess):
    """A rank (or iperf3 server) as its own job step; output forwarded by srun into `log_path` on this machine."""

    def __init__(self, cluster: SlurmCluster, host: Host, proc: subprocess.Popen, step_name: str, log_path: Path):
        self.cluster, self.host, self.proc, self.step_name, self.log_path = cluster, host, proc, step_name, log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill_group(self, grace_s: float = 3.0) -> None:
        """scancel --signal=TERM the step, KILL what is left after `grace_s`, then reap the local srun."""
        if self.proc.poll() is not None:
            return
        self.cluster.cancel_step(self.step_name, self.proc, grace_s=grace_s)

    def handle(self) -> dict[str, Any]:
        return {"host": self.host.name, "step_name": self.step_name}


# ---------------------------------------------------------------------------------------------------- the cluster
class SlurmCluster(LabCluster):
    """The nodes of Slurm job `job_id`; every command a job step (no SSH)."""

    backend = "slurm"
    transport = "srun"

    def __init__(self, name: str, specs: list[LabHostSpec], *, job_id: str, helper_named: bool = False,
                 allow_cpu: bool = False, inventory_path: str | Path | None = None):  # fmt: skip
        super().__init__(name, specs, inventory_path=inventory_path, allow_cpu=allow_cpu)
        self.job_id = str(job_id)
        self.helper_named = helper_named  # nodes from an inventory (provisioned by the role): root runs the helper
        self._alive_checked = False

    # ------------------------------------------------------------------------------------------------ building
    @classmethod
    def from_allocation(
        cls,
        name: str,
        *,
        iface: str | None = None,
        inventory: str | Path | None = None,
        allow_cpu: bool = False,
        environ: dict[str, str] | None = None,
    ) -> SlurmCluster:
        """The cluster of the allocation this process runs in. InputError (nothing changed) outside an allocation,
        without a data interface, or when the inventory lacks a node of the allocation."""
        env = os.environ if environ is None else environ
        job_id, nodelist = env.get("SLURM_JOB_ID"), env.get("SLURM_JOB_NODELIST")
        if not job_id:
            raise InputError(NOT_IN_ALLOCATION)
        if not nodelist:
            raise InputError(NOT_IN_ALLOCATION.replace("SLURM_JOB_ID unset", "SLURM_JOB_NODELIST unset"))
        nodes = allocation_nodes(job_id, nodelist)
        by_name: dict[str, LabHostSpec] = {}
        if inventory is not None:
            by_name = {s.name: s for s in load_inventory(inventory)}
            missing = [n for n in nodes if n not in by_name]
            if missing:
                raise InputError(
                    f"--inventory {inventory}: the allocation's nodes {', '.join(missing)} are not in it (it lists "
                    f"{', '.join(by_name)}); inventory host names must be the Slurm node names"
                )
        elif not iface:
            raise InputError("--slurm needs the data interface: --iface NIC, or --inventory with testbed_data_iface")
        specs = []
        for n in nodes:
            base = by_name.get(n)
            ssh = SSHTarget(name=n, address=n)  # unused: every command is a job step
            if base is None:
                spec = LabHostSpec(name=n, ssh=ssh, data_iface=iface or "", data_address=None, gpus=0,
                                   python=sys.executable, project_dir=str(REPO), run_dir=DEFAULT_RUN_DIR)  # fmt: skip
            else:
                spec = dataclasses.replace(base, ssh=ssh, data_iface=iface or base.data_iface)
            specs.append(dataclasses.replace(spec, become=os.geteuid() != 0))
        return cls(name, specs, job_id=job_id, helper_named=inventory is not None, allow_cpu=allow_cpu,
                   inventory_path=inventory)  # fmt: skip

    @classmethod
    def up(  # type: ignore[override]
        cls,
        name: str,
        *,
        iface: str | None = None,
        inventory: str | Path | None = None,
        shape: LinkShape | None = None,
        allow_cpu: bool = False,
    ) -> tuple[SlurmCluster, dict[str, Any]]:
        """Check every node of the allocation (facts through srun), shape if asked, record the cluster. Nothing
        half-done: a failure after shaping clears it again and writes no record."""
        registry.check_name(name)
        cluster = cls.from_allocation(name, iface=iface, inventory=inventory, allow_cpu=allow_cpu)
        cluster.require_allocation()
        cluster.check(rate_bps=shape.rate_bps if shape else None)
        return cluster, cluster.shape_and_record(shape)

    def to_record(self) -> dict[str, Any]:
        specs = []
        for s in self.specs.values():
            d = dataclasses.asdict(s)
            d.pop("ssh")
            d["shaping_peers"] = list(s.shaping_peers) if s.shaping_peers is not None else None
            d["data_address"] = s.data_address or next((h.address for h in self._hosts or [] if h.name == s.name), None)
            specs.append(d)
        return {
            "name": self.name,
            "backend": self.backend,
            "job_id": self.job_id,
            "inventory": str(self.inventory_path) if self.inventory_path else None,
            "allow_cpu": self.allow_cpu,
            "helper_named": self.helper_named,
            "hosts": [{"name": s["name"], "data_iface": s["data_iface"]} for s in specs],
            "specs": specs,
            "shape": (self.record or {}).get("shape"),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SlurmCluster:
        try:
            specs = []
            for d in record["specs"]:
                d = dict(d)
                peers = d.pop("shaping_peers")
                specs.append(LabHostSpec(ssh=SSHTarget(name=d["name"], address=d["name"]),
                                         shaping_peers=tuple(peers) if peers is not None else None, **d))  # fmt: skip
            cluster = cls(record["name"], specs, job_id=str(record["job_id"]), allow_cpu=bool(record.get("allow_cpu")),
                          helper_named=bool(record.get("helper_named")), inventory_path=record.get("inventory"))  # fmt: skip
        except (KeyError, TypeError) as e:
            raise InputError(f"slurm cluster {record.get('name')!r}: its record is incomplete ({e})") from None
        cluster.record = dict(record)
        return cluster

    # ------------------------------------------------------------------------------------------- the allocation
    def require_allocation(self) -> None:
        """One clear line when the job this cluster lives in has ended (checked once per object)."""
        if self._alive_checked:
            return
        state, detail = job_state(self.job_id)
        if state not in ALIVE_STATES:
            raise ClusterError(
                f"cluster {self.name!r}: its Slurm job {self.job_id} has ended ({state or detail or 'unknown to squeue'}"
                f"); the cluster is gone with it: `testbed down --name {self.name}` forgets it"
            )
        self._alive_checked = True

    def step_name(self) -> str:
        return f"tb-{self.name}-{secrets.token_hex(4)}"

    def end_leftover(self, handle: dict[str, Any]) -> bool:
        """A killed controller's step (rank or iperf3 server): its name is unique to this cluster and launch, so a
        step still running under it is that one; cancelled TERM, then KILL (scancel)."""
        step = str(handle.get("step_name") or "")
        if not step.startswith(f"tb-{self.name}-") or step not in self.steps():
            return False
        self.cancel_step(step, None)
        return True

    def steps(self) -> dict[str, str]:
        """Step name -> step id (JOB.STEP) of the job's running steps."""
        res = subprocess.run([_tool("squeue"), "-h", "-s", "-j", self.job_id, "-o", "%i %j"], capture_output=True,
                             text=True, env=client_env(), timeout=30)  # fmt: skip
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out[parts[1]] = parts[0]
        return out

    def _scancel(self, step_id: str, sig: str) -> None:
        subprocess.run([_tool("scancel"), f"--signal={sig}", step_id], capture_output=True, text=True,
                       env=client_env(), timeout=30)  # fmt: skip

    def cancel_step(self, step_name: str, proc: subprocess.Popen | None = None, *, grace_s: float = 3.0) -> None:
        """End a step: TERM to every process of it (Slurm tracks them), KILL after `grace_s`; then reap `proc` (the
        local srun). A step not yet registered is looked up again until `grace_s` passes."""
        deadline = time.monotonic() + grace_s
        step_id = None
        while step_id is None and (proc is None or proc.poll() is None):
            step_id = self.steps().get(step_name)
            if step_id is None and time.monotonic() > deadline:
                break
            if step_id is None:
                time.sleep(0.2)  # paces squeue while the step registers
        if step_id is not None:

            def gone() -> bool:
                return proc.poll() is not None if proc is not None else step_name not in self.steps()

            self._scancel(step_id, "TERM")
            end = time.monotonic() + grace_s
            while not gone() and time.monotonic() < end:
                time.sleep(0.2)  # paces the checks
            if not gone():
                self._scancel(step_id, "KILL")
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # srun itself hangs: end it (the step's processes are gone)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # ------------------------------------------------------------------------------------- LabCluster primitives
    def conn(self, name: str) -> SrunConnection:  # type: ignore[override]
        if name not in self._conns:
            self._conns[name] = SrunConnection(self, self.specs[name].name)  # type: ignore[assignment]
        return self._conns[name]  # type: ignore[return-value]

    def _fresh_conn(self, name: str) -> SrunConnection:  # type: ignore[override]
        return SrunConnection(self, self.specs[name].name)

    def _where(self, name: str) -> dict[str, str]:
        return {"slurm": f"job {self.job_id} node {name}"}

    def _shaping_argv(self, spec: LabHostSpec, *args: str) -> list[str]:
        """sudo -n <helper> as a normal user; as root the helper itself when the nodes come from an inventory (the
        role installed it there), else the host's Python."""
        if spec.become:
            return ["sudo", "-n", spec.shaping_helper, *args]
        if self.helper_named:
            return [spec.shaping_helper, *args]
        return [spec.python, "-m", "shaping", *args]

    def provision(self, run_playbook: bool = True, **kw: Any) -> dict[str, dict[str, Any]]:
        """Slurm nodes are provisioned by their admins (the testbed_host role); only the checks run."""
        return self.check(rate_bps=kw.get("rate_bps"))

    def start(
        self, host: Host | str, argv: list[str], *, env: dict[str, str], log_path: Path, workdir: Path | None = None
    ) -> SrunRankProcess:
        """Start argv on the host as its own job step; its output goes to `log_path` here (srun forwards it)."""
        self.require_allocation()
        spec = self._spec(host)
        h = host if isinstance(host, Host) else self.host(host)
        self._make_attempt_dir(spec)  # the attempt's private directory (rank_out_dir), as on lab hosts
        name = self.step_name()
        # the rank's variables travel in srun's environment, exported to the step by name (srun_argv)
        line = command_line(self._host_argv(spec, argv), cwd=str(workdir) if workdir else spec.project_dir)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(
                    [*self.conn(spec.name).srun_argv(name, tuple(env)), "/bin/sh", "-c", line],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env={**client_env(), **env},
                    start_new_session=True,
                )  # fmt: skip
            except OSError as e:
                raise LaunchError(f"host {spec.name}: starting srun failed: {e}") from None
        p = SrunRankProcess(self, h, proc, name, log_path)
        self._started.append(p)  # type: ignore[arg-type]
        return p

    def down(self) -> str:
        """End the steps this cluster started (also by other controller processes: named tb-<cluster>-*), clear the
        shaping of every node (--forget: timers and state too), forget the record. When the job has already ended,
        Slurm has ended every step and the Epilog cleared the shaping: only the record is removed."""
        state, _ = job_state(self.job_id)
        if state not in ALIVE_STATES:
            if self.record is not None:
                registry.delete_record(self.name)
            return f"Slurm job {self.job_id} has ended ({state or 'gone'}); record removed"
        self.kill_started()
        prefix = f"tb-{self.name}-"
        for step_name in [n for n in self.steps() if n.startswith(prefix)]:
            self.cancel_step(step_name, grace_s=2.0)

        def host_down(n: str) -> None:
            spec = self.specs[n]
            res = self.run(n, self._shaping_argv(spec, "clear", "--dev", spec.data_iface, "--forget", "--json"))
            if res.returncode != 0:
                raise ClusterError(f"host {n}: clearing shaping failed: {res.stderr.strip()}")

        errors = [str(r) for r in self._each(host_down, list(self.specs)).values() if isinstance(r, TestbedError)]
        if errors:
            raise ClusterError("; ".join(errors))
        if self.record is not None:
            registry.delete_record(self.name)
        return f"shaping cleared on {len(self.specs)} nodes of Slurm job {self.job_id}, steps ended"

    def status(self) -> dict[str, Any]:
        self.require_allocation()
        return {**super().status(), "slurm_job": self.job_id}


__all__ = ["NOT_IN_ALLOCATION", "SlurmCluster", "SrunConnection", "SrunRankProcess"]
