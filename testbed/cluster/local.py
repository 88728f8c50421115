"""The embedded default cluster: N emulated hosts on this machine.

Each host is a network namespace `tb-<cluster>-h<i>` with one data interface `eth0`, joined by a veth pair to a
bridge `br0` in a switch namespace `tb-<cluster>-sw`, so the machine's own network is never touched:

    h0:eth0 ==veth== sw:h0 --+
    h1:eth0 ==veth== sw:h1 --+-- br0   (in namespace tb-<cluster>-sw)
    ...                      |

Both ends of every veth are shaped: the host side shapes upload, the switch side download. Everything is found
again by name prefix, so `down` also cleans what a crashed `up` left: it kills processes inside the namespaces first,
then deletes the namespaces (which removes their veths and qdiscs).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from pyroute2 import netns

from shaping import tc
from shaping.netns_route import open_route
from shaping.plan import LinkShape
from testbed.cluster import registry, topology
from testbed.cluster.base import Cluster, Host, RankProcess, shared_cpu_threads
from testbed.cluster.netns_exec import argv_in_namespace
from testbed.errors import ClusterError, InputError, PermissionDenied
from testbed.gpus import assign_gpus  # one home, importable without pyroute2 (the GPU check's loopback fallback)

NS_PREFIX = "tb-"
DATA_IFACE = "eth0"
BRIDGE = "br0"
DEFAULT_SUBNET = "10.77.0.0/24"
MAX_HOSTS = 64


def switch_ns(cluster: str) -> str:
    return f"{NS_PREFIX}{cluster}-sw"


def host_ns(cluster: str, index: int) -> str:
    return f"{NS_PREFIX}{cluster}-h{index}"


MARK_PREFIX = "testbed-cluster:"  # the alias of `lo` in every namespace the testbed made: "testbed-cluster:<name>"


def namespace_mark(ns: str) -> str | None:
    """The cluster name a namespace was marked with by `up`, or None (a namespace the testbed did not make, even one
    named like ours, e.g. someone's `tb-foo-vpn`). Opened with `open_route`, which never creates a namespace: one
    listed a moment ago may be gone, removed by the `down` of its own cluster, and a query must not bring it back (a
    full suite's `testbed ls` once did, leaving one behind)."""
    try:
        with open_route(ns) as ipr:
            lo = ipr.link_lookup(ifname="lo")
            alias = ipr.get_links(lo[0])[0].get_attr("IFLA_IFALIAS") if lo else None
    except Exception:  # noqa: BLE001 - gone meanwhile, or not enterable: not ours to touch either way
        return None
    return alias[len(MARK_PREFIX) :] if alias and alias.startswith(MARK_PREFIX) else None


def cluster_namespaces(cluster: str) -> list[str]:
    """Namespaces of this cluster that exist now: named with its prefix and marked as its own by `up` (also those
    of a crashed `up`), or listed in its record."""
    prefix = f"{NS_PREFIX}{cluster}-"
    recorded = set((registry.load_record(cluster) or {}).get("namespaces") or []) | set(registry.building(cluster))
    return sorted(
        n for n in netns.listnetns() if n in recorded or (n.startswith(prefix) and namespace_mark(n) == cluster)
    )


def all_testbed_clusters() -> list[str]:
    """Local clusters on this machine: recorded ones and those whose marked namespaces outlived their record."""
    names = {mark for n in netns.listnetns() if n.startswith(NS_PREFIX) and (mark := namespace_mark(n))}
    return sorted(
        names
        | set(registry.building_names())
        | {n for n in registry.recorded_names() if (registry.load_record(n) or {}).get("backend") == "local"}
    )


def require_root() -> None:
    if os.geteuid() != 0:
        raise PermissionDenied("the local cluster needs root or CAP_NET_ADMIN (network namespaces, veth, tc)")


class LocalRankProcess(RankProcess):
    def __init__(self, host: Host, popen: subprocess.Popen, log_path: Path):
        self.host = host
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.popen.wait(timeout_s)

    def kill_group(self, grace_s: float = 3.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while children of its group live on: SIGKILL the group regardless
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace_s)

    def handle(self) -> dict[str, Any]:
        return {"host": self.host.name, "pgid": self.popen.pid, "start_ticks": registry.process_start_ticks(self.pid)}


def end_process_group(pgid: int, start_ticks: int | None, grace_s: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after grace_s, the process group led by `pgid`, only while its leader is the process
    that started at `start_ticks` (a pid reused since is left alone). True when the group was signalled."""
    if not isinstance(pgid, int) or pgid <= 1 or start_ticks is None:
        return False
    if registry.process_start_ticks(pgid) != start_ticks:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and registry.process_start_ticks(pgid) == start_ticks:
        time.sleep(0.02)  # polling for the leader's exit, bounded by the grace period
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # what is left of the group, the leader gone or not
    return True


def _ns_inode(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/run/netns/{name}")
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def pids_in_namespace(name: str) -> list[int]:
    """PIDs whose network namespace is `name` (what `ip netns pids` reports)."""
    target = _ns_inode(name)
    if target is None:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if (st.st_dev, st.st_ino) == target:
            pids.append(int(entry))
    return pids


def kill_namespace_processes(name: str, grace_s: float = 2.0) -> int:
    """SIGTERM every process inside namespace `name`, SIGKILL what remains after grace_s; returns how many."""
    pids = pids_in_namespace(name)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (alive := pids_in_namespace(name)):
            pids = alive
            time.sleep(0.02)  # polling for exit with a deadline, not synchronising on a guess
        pids = pids_in_namespace(name)
        if not pids:
            break
    return len(pids)


class LocalCluster(Cluster):
    backend = "local"

    def __init__(self, record: dict[str, Any]):
        self.record = record
        self.name = record["name"]

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LocalCluster:
        return cls(record)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(
        cls,
        name: str,
        n_hosts: int,
        *,
        shape: LinkShape | None = None,
        subnet: str = DEFAULT_SUBNET,
        recreate: bool = False,
        force: bool = False,
        gpus: list[int] | None = None,
        racks: int | None = None,
        uplink_bps: int | None = None,
    ) -> tuple[LocalCluster, bool]:
        """Bring the cluster up; returns (cluster, created). An identical existing cluster is returned as is.
        `gpus`: this machine's CUDA device indices to share out among the hosts (see `assign_gpus`).
        `racks`, `uplink_bps`: hosts in racks joined through a spine shaped at the uplink rate (cluster/topology.py)."""
        registry.check_name(name)
        net = _check_subnet(subnet, n_hosts)
        n_racks = topology.check_racks(n_hosts, racks, uplink_bps)
        rack_info = topology.racks_record(name, n_hosts, n_racks, uplink_bps)
        host_rack = {h: j for j, m in enumerate(rack_info["members"]) for h in m} if rack_info else {}
        per_host = assign_gpus(gpus or [], n_hosts)
        require_root()
        with registry.locked(name):
            existing = registry.load_record(name)
            wanted = {"hosts": n_hosts, "subnet": str(net), "shape": shape.to_dict() if shape else None,
                      "gpus": per_host, "racks": rack_info}  # fmt: skip
            if existing is not None and not recreate:
                have = {"hosts": len(existing["hosts"]), "subnet": existing["subnet"], "shape": existing.get("shape"),
                        "gpus": [h.get("gpus", []) for h in existing["hosts"]], "racks": existing.get("racks")}  # fmt: skip
                if existing.get("backend") != "local":
                    raise InputError(f"cluster {name!r} is a {existing.get('backend')} cluster; use another --name")
                if have == wanted and all(n in netns.listnetns() for n in existing["namespaces"]):
                    return cls(existing), False
                raise InputError(
                    f"cluster {name!r} is already up with {have['hosts']} hosts ({_describe_shape(have['shape'])}); "
                    f"asked for {n_hosts} hosts ({_describe_shape(wanted['shape'])}). Use --recreate, "
                    f"`testbed shape`, or `testbed down --name {name}` first"
                )
            _destroy(name)  # leftovers of a crashed up, or --recreate
            record = {
                "name": name,
                "backend": "local",
                "subnet": str(net),
                "shape": wanted["shape"],
                "namespaces": [switch_ns(name), *(rack_info or {}).get("namespaces", [])]
                + [host_ns(name, i) for i in range(n_hosts)],
                "racks": rack_info,
                "hosts": [
                    {
                        "name": f"h{i}",
                        "address": str(net.network_address + i + 1),
                        "data_iface": DATA_IFACE,
                        "netns": host_ns(name, i),
                        "switch_port": f"h{i}",
                        "switch_netns": topology.rack_ns(name, host_rack[f"h{i}"]) if rack_info else switch_ns(name),
                        "gpus": per_host[i],
                    }
                    for i in range(n_hosts)
                ],
                "created_at": time.time(),
            }
            foreign = sorted(set(record["namespaces"]) & set(netns.listnetns()))  # ours were removed just above
            if foreign:
                raise InputError(
                    f"namespace {foreign[0]} exists and is not the testbed's (no testbed mark); choose another --name"
                )
            registry.note_building(name, record["namespaces"])
            try:
                _build(record, net.prefixlen)
                topology.shape_uplinks(record, switch_ns(name))
                cluster = cls(record)
                if shape is not None:
                    cluster.apply_shaping(shape, force=force)
                registry.save_record(name, record)
                registry.clear_building(name)
            except BaseException:
                _destroy(name)  # a failure (or Ctrl-C) halfway leaves nothing behind
                raise
            return cluster, True

    @staticmethod
    def remove(name: str) -> list[str]:
        """Remove everything of cluster `name` (also a crashed one's leftovers). Returns the namespaces removed."""
        registry.check_name(name)
        with registry.locked(name):
            return _destroy(name)

    def down(self) -> str:
        """Remove this cluster: its processes, namespaces, saved qdiscs and record."""
        return f"removed {len(self.remove(self.name))} namespaces"

    # ------------------------------------------------------------------ Cluster interface
    def hosts(self) -> list[Host]:
        return [
            Host(h["name"], h["address"], h["data_iface"], h["netns"], gpus=tuple(h.get("gpus", ())), emulated=True)
            for h in self.record["hosts"]
        ]

    def command_prefix(self, host: Host) -> list[str]:
        """Enter the host's namespace from Python (testbed/cluster/netns_exec.py: setns, then exec), so neither
        ranks nor `testbed exec` need the `ip` binary."""
        return argv_in_namespace(host.netns, [])

    def threads_per_rank(self, world_size: int) -> int:
        """Every rank of a local trial runs on this machine: its CPUs shared evenly, at least one each."""
        return shared_cpu_threads(world_size)

    def _argv(self, host: Host, argv: list[str]) -> list[str]:
        return [*self.command_prefix(host), *argv]

    def run(self, host: Host, argv: list[str], *, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(self._argv(host, argv), capture_output=True, text=True, timeout=timeout_s, check=False)

    def rank_out_dir(self, local_dir: Path, trial_id: str) -> Path:
        """The results directory itself, absolute: ranks run in a working directory of their own (`start`)."""
        return Path(local_dir).absolute()

    def start(
        self, host: Host, argv: list[str], *, env: dict[str, str], log_path: Path, workdir: Path | None = None
    ) -> LocalRankProcess:
        """Start argv in the host's namespace, in a process group of its own. A Python rank runs as root, so it
        runs with `-P` (neither the working directory nor a script's folder on sys.path: a `runners/` or `json.py`
        planted where the user stands is never imported), the project's code root first on PYTHONPATH, and in a
        fixed working directory: `workdir`, else the folder of its log (the controller made it for this run)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # emulated hosts are this machine: its PATH finds the tools a rank calls (the plan adds the loader variables)
        env = {"PATH": os.environ.get("PATH", os.defpath), **env}
        argv = _python_isolated(argv, env)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                self._argv(host, argv),
                env=env,
                cwd=workdir or log_path.parent.absolute(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return LocalRankProcess(host, popen, log_path)

    def fetch(self, host: Host, remote_dir: Path, local_dir: Path) -> None:
        if Path(remote_dir).resolve() != Path(local_dir).resolve():
            raise ClusterError("local hosts share this machine's filesystem: write results where they are read")

    def end_leftover(self, handle: dict[str, Any]) -> bool:
        """A killed controller's rank or iperf3 server: its process group, if its leader is still that process."""
        return end_process_group(handle.get("pgid"), handle.get("start_ticks"))

    def links(self, hosts: list[Host] | None = None) -> list[tuple[Host, str, str, str]]:
        """(host, direction, netns, ifname) for both ends of each host's veth."""
        out = []
        for h in hosts or self.hosts():
            out.append((h, "upload", h.netns, DATA_IFACE))
            out.append((h, "download", self._switch_side(h), h.name))
        return out

    def _switch_side(self, host: Host) -> str:
        """The namespace of the switch port a host's veth joins: its rack's switch, or the one switch."""
        entry = next((h for h in self.record["hosts"] if h["name"] == host.name), {})
        return entry.get("switch_netns") or switch_ns(self.name)

    def apply_shaping(self, shape: LinkShape, hosts: list[Host] | None = None, *, force: bool = False) -> list[dict]:
        """Shape both directions of every (or the given) host's link; all-or-nothing."""
        applied: list[tuple[str, str]] = []
        results = []
        previous = {(ns, ifn): tc.show(ifn, netns=ns) for _, _, ns, ifn in self.links(hosts)}
        try:
            for host, direction, ns, ifname in self.links(hosts):
                results.append(
                    {
                        "host": host.name,
                        "direction": direction,
                        **tc.apply(ifname, shape, netns=ns, force=force, state_dir=registry.state_dir()),
                    }
                )
                applied.append((ns, ifname))
        except BaseException:
            for ns, ifname in applied:  # put back what each link had before this call
                before = previous[(ns, ifname)]
                if before["owned"] and before["rate_bps"]:
                    restore = LinkShape.from_dict(
                        before, read_back=True
                    )  # a previous delay/loss too, not only the rate
                    tc.apply(ifname, restore, netns=ns, state_dir=registry.state_dir())
                else:
                    tc.clear(ifname, netns=ns, state_dir=registry.state_dir())
            raise
        if hosts is None:
            self._set_recorded_shape(shape.to_dict())
        return results

    def clear_shaping(self, hosts: list[Host] | None = None) -> None:
        for _, _, ns, ifname in self.links(hosts):
            tc.clear(ifname, netns=ns, state_dir=registry.state_dir())
        if hosts is None:
            self._set_recorded_shape(None)

    def _set_recorded_shape(self, shape: dict | None) -> None:
        self.record["shape"] = shape
        if registry.load_record(self.name) is not None:
            registry.save_record(self.name, self.record)

    def recorded_shape(self) -> LinkShape | None:
        s = self.record.get("shape")
        return LinkShape.from_dict(s) if s else None

    def status(self) -> dict[str, Any]:
        hosts = []
        for h in self.hosts():
            links = {}
            for _, direction, ns, ifname in self.links([h]):
                links[direction] = {"netns": ns, "ifname": ifname, **tc.show(ifname, netns=ns)}
            hosts.append(
                {"name": h.name, "address": h.address, "data_iface": h.data_iface, "netns": h.netns,
                 "gpus": list(h.gpus), "links": links}  # fmt: skip
            )
        return {
            "name": self.name,
            "backend": self.backend,
            "subnet": self.record["subnet"],
            "switch_netns": switch_ns(self.name),
            "shape": self.record.get("shape"),
            "hosts": hosts,
            **self._racks_status(),
        }

    def _racks_status(self) -> dict[str, Any]:
        if not self.record.get("racks"):
            return {}
        rate = (self.record.get("shape") or {}).get("rate_bps")
        return {"racks": {**self.record["racks"], "oversubscription": topology.oversubscription(self.record, rate),
                          "summary": topology.describe(self.record, rate),
                          "uplinks": topology.uplink_status(self.record, switch_ns(self.name))}}  # fmt: skip


CODE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds testbed/, runners/ and shaping/


def _python_isolated(argv: list[str], env: dict[str, str]) -> list[str]:
    """argv with `-P` after a Python interpreter (`python -m runners.train ...`); the code root the controller runs
    from goes first on env's PYTHONPATH (in place), so the rank imports the same runners/ and nothing of its cwd."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return list(argv)
    if (CODE_ROOT / "runners" / "__init__.py").is_file():
        env["PYTHONPATH"] = ":".join(p for p in (str(CODE_ROOT), env.get("PYTHONPATH")) if p)
    if len(argv) > 1 and argv[1] in ("-P", "-I"):
        return list(argv)
    return [argv[0], "-P", *argv[1:]]


def _describe_shape(shape: dict | None) -> str:
    if not shape:
        return "unshaped"
    return LinkShape.from_dict(shape).describe()


def _check_subnet(subnet: str, n_hosts: int) -> ipaddress.IPv4Network:
    if not isinstance(n_hosts, int) or not 1 <= n_hosts <= MAX_HOSTS:
        raise InputError(f"--hosts {n_hosts}: accepted 1 to {MAX_HOSTS}")
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise InputError(f"--subnet {subnet!r}: {e}; expected an IPv4 network like {DEFAULT_SUBNET}") from None
    if not net.is_private:
        raise InputError(f"--subnet {subnet}: not a private range; emulated hosts use private addresses only")
    if net.num_addresses - 2 < n_hosts:
        raise InputError(f"--subnet {subnet} has room for {net.num_addresses - 2} hosts, not {n_hosts}")
    return net


def _build(record: dict[str, Any], prefixlen: int) -> None:
    sw = switch_ns(record["name"])
    topology.create_namespace(sw)  # (registry.note_building named it first: a SIGKILL before the mark still leaves it ours)
    mark = f"{MARK_PREFIX}{record['name']}"  # `down` removes only namespaces that carry the mark
    with open_route(sw) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up", ifalias=mark)
        ipr.link("add", ifname=BRIDGE, kind="bridge")
        br = ipr.link_lookup(ifname=BRIDGE)[0]
        ipr.link("set", index=br, state="up")
        if record.get("racks"):
            topology.build_racks(ipr, record, mark)
    for h in record["hosts"]:
        topology.create_namespace(h["netns"])
        with open_route(h.get("switch_netns") or sw) as ipr:  # the host's rack switch, or the one switch
            ipr.link("add", ifname=h["switch_port"], kind="veth", peer={"ifname": DATA_IFACE, "net_ns_fd": h["netns"]})
            port = ipr.link_lookup(ifname=h["switch_port"])[0]
            ipr.link("set", index=port, master=ipr.link_lookup(ifname=BRIDGE)[0], state="up")
            with open_route(h["netns"]) as hipr:
                hipr.link("set", index=hipr.link_lookup(ifname="lo")[0], state="up", ifalias=mark)
                eth = hipr.link_lookup(ifname=DATA_IFACE)[0]
                hipr.addr("add", index=eth, address=h["address"], prefixlen=prefixlen)
                hipr.link("set", index=eth, state="up")


def _destroy(name: str) -> list[str]:
    """Kill processes in, then delete, every namespace of the cluster; forget its record and saved qdiscs."""
    require_root()
    removed = []
    spaces = cluster_namespaces(name)
    # hosts first, the switch last: processes may only live in host namespaces, but check all
    for ns in sorted(spaces, key=lambda n: n.endswith("-sw")):
        kill_namespace_processes(ns)
        with contextlib.suppress(FileNotFoundError):
            netns.remove(ns)
        removed.append(ns)
    leftover = cluster_namespaces(name)
    if leftover:
        raise ClusterError(f"could not remove namespaces {', '.join(leftover)}")
    backups = tc.backup_dir(registry.state_dir())
    for path in backups.glob(f"{NS_PREFIX}{name}-*__*.json") if backups.is_dir() else []:
        path.unlink(missing_ok=True)
    registry.delete_record(name)
    registry.clear_building(name)
    return removed
