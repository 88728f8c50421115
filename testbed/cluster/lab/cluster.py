"""The lab cluster: hosts from an Ansible inventory (inventory.py), reached over SSH (paramiko, ssh.py).

The same shaping code as local mode runs on each host (`python -m shaping ...`, see shaping/__main__.py): every change
is commit-confirmed (a timer on the host restores the previous qdiscs unless this controller confirms over a *new* SSH
connection within `confirm_within_s`), and the interface carrying the SSH session is refused unless forced.


The inventory's keys are documented in inventory.py; host facts are judged in facts.py, processes are started and
ended on the hosts by remote.py, the hosts are provisioned by provision.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from shaping.plan import LinkShape
from testbed.cluster import registry
from testbed.cluster.base import Cluster, Host
from testbed.cluster.lab import provision
from testbed.cluster.lab.facts import HOST_FACTS, evaluate_facts, problems_error, status_fields, version_disagreements
from testbed.cluster.lab.host_shaping import LabShaping
from testbed.cluster.lab.inventory import LabHostSpec, load_inventory
from testbed.cluster.lab.remote import (
    TOKEN_ENV,
    LabRankProcess,
    end_processes_script,
    kill_group_script,
    sweep_attempts_line,
)
from testbed.cluster.ssh import (
    SSHConnection,
    command_line,
    detached_command_line,
    env_file_text,
    private_dir_check_line,
    private_dir_line,
)
from testbed.errors import ClusterError, InputError, LaunchError, ShapingError, TestbedError


class LabCluster(LabShaping, Cluster):
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

    def conn(self, name: str) -> SSHConnection:
        """The connection to host `name`, opened once and kept (its started processes reach their host through it)."""
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
        res = self.conn(name).run(["ip", "-j", "-4", "addr", "show", "dev", s.data_iface], timeout_s=30)
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
        return self.conn(spec.name).run(self._host_argv(spec, argv), cwd=spec.project_dir, timeout_s=timeout_s)

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
        conn = self.conn(spec.name)
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
        conn = self.conn(spec.name)
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
        res = self.conn(spec.name).run_line(line, timeout_s=30)
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
        res = self.conn(name).run(
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
            raise problems_error(problems)
        return results

    def provision(
        self, run_playbook: bool = True, *, extra_vars: dict[str, Any] | None = None, rate_bps: int | None = None
    ) -> dict[str, dict[str, Any]]:
        """Run ansible/playbooks/provision.yml against the inventory (after checking every host is reachable with a
        known key), then `check()`. Returns the facts of each host."""
        if run_playbook:
            reach = self._each(lambda n: self.conn(n).connect() and True, list(self.specs))
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
        return provision.run_playbook(
            self.inventory_path,
            playbook,
            extra_vars=extra_vars,
            accept_new_host_keys=self.accept_new_host_keys,
            timeout_s=timeout_s,
        )

    def end_leftover(self, handle: dict[str, Any]) -> bool:
        """A killed controller's rank or iperf3 server on a lab host: its process group, only while the leader still
        carries the token it was started with (kill_group_script checks; a reused pid is left alone)."""
        pgid, token = handle.get("pgid"), str(handle.get("token") or "")
        if not isinstance(pgid, int) or pgid <= 1 or not re.fullmatch(r"[A-Za-z0-9_.-]+-[0-9a-f]{12}", token):
            return False
        self.conn(str(handle["host"])).run_line(kill_group_script(pgid, token, 3.0), timeout_s=40)
        return True

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
                row.update(status_fields(f, h.data_iface))
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
            self.conn(n).run_line(script, timeout_s=120)
            # --forget: also end a dead-man timer still waiting and remove the commit-confirm state directory
            argv = self._shaping_argv(spec, "clear", "--dev", spec.data_iface, "--forget", "--json")
            res = self.run(n, argv, timeout_s=60)
            if res.returncode != 0:
                raise ShapingError(f"host {n}: clearing shaping failed: {res.stderr.strip()}")

        errors = [str(r) for r in self._each(host_down, list(self.specs)).values() if isinstance(r, TestbedError)]
        if not errors:  # the attempts' directories left by trials that failed before fetching (private, the user's)
            pattern = f"{self._run_parent(next(iter(self.specs.values())))}/tb-{self.name}."
            self._each(lambda n: self.conn(n).run_line(sweep_attempts_line(pattern), timeout_s=120), list(self.specs))
        self.close()
        if errors:
            raise ClusterError("; ".join(errors))
        if self.record is not None:
            registry.delete_record(self.name)
        return "lab shaping cleared, rank processes ended"
