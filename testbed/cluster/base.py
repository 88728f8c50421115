"""What every cluster backend offers the rest of the testbed.

The launcher, `status`, `exec`, `shape`, `probe` and `down` only talk to this interface, so the local emulated
cluster (`local.py`) and lab hosts over SSH (`lab.py`) share one code path: no caller tests `backend` or `hasattr`.
Bringing a cluster up differs by backend (`LocalCluster.up(name, n_hosts, ...)`, `LabCluster.up(name, inventory,
...)`); `backends.open_cluster(name)` reopens either by name.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

from shaping.plan import LinkShape
from testbed.errors import InputError


def rack_members(n_hosts: int, racks: int) -> list[list[str]]:
    """The local cluster's hosts of each rack (`up --racks`): consecutive hosts, h0..h(k-1) in the first. Ranks follow
    host order, so a ring leaves and enters each rack once per step (cluster/topology.py draws it)."""
    per = n_hosts // racks
    return [[f"h{i}" for i in range(j * per, (j + 1) * per)] for j in range(racks)]


def oversubscription(members: list[list[str]], host_rate_bps: dict[str, int | None], uplink_bps: int | None
                     ) -> float | None:  # fmt: skip
    """The worst rack's sum of its hosts' rates over its uplink (None: no uplink rate, or an unshaped host)."""
    if not uplink_bps or not members or any(host_rate_bps.get(h) is None for rack in members for h in rack):
        return None
    return max(sum(host_rate_bps[h] for h in rack) for rack in members) / uplink_bps


def shared_cpu_threads(ranks: int) -> int:
    """CPU threads each of `ranks` processes gets when they share this machine's cores evenly, at least one: what each
    rank of a local trial runs with, and what a co-located profile of that many ranks measures with."""
    return max(1, (os.cpu_count() or 1) // max(1, ranks))


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a cluster, as the launcher and the CLI see it."""

    name: str  # "h0", or the inventory name of a lab host
    address: str  # data-plane IPv4 address: ranks and probes talk to this
    data_iface: str  # the interface that carries training traffic (the shaped one)
    netns: str | None = None  # local backend: the host's network namespace
    gpus: tuple[int, ...] = ()  # CUDA devices of this host (local: this machine's indices given to it by `up --gpus`)
    emulated: bool = False  # one of several emulated hosts on one machine (own NCCL host id, own CUDA devices)


class RankProcess(abc.ABC):
    """A process started on a host in its own process group; the launcher watches and ends it."""

    host: Host

    @abc.abstractmethod
    def poll(self) -> int | None:
        """Exit code, or None while running."""

    @abc.abstractmethod
    def kill_group(self) -> None:
        """End the whole process group this process leads (SIGTERM, then SIGKILL), and reap it."""

    def handle(self) -> dict[str, Any] | None:
        """JSON that finds this process again from another controller process (`Cluster.end_leftover`) after this
        one was killed: the host, the process group and what proves it is still the same process. None: cannot."""
        return None


class Cluster(abc.ABC):
    """A set of hosts that can run commands, start ranks and shape their data links."""

    name: str
    backend: str  # "local" | "lab" | "slurm"

    @abc.abstractmethod
    def hosts(self) -> list[Host]: ...

    @abc.abstractmethod
    def run(self, host: Host, argv: list[str], *, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """Run a command on a host to completion; text output captured."""

    @abc.abstractmethod
    def start(
        self, host: Host, argv: list[str], *, env: dict[str, str], log_path: Path, workdir: Path | None = None
    ) -> RankProcess:
        """Start a long-running process (a rank, an iperf3 server) in a new process group, output to log_path."""

    @abc.abstractmethod
    def fetch(self, host: Host, remote_dir: Path, local_dir: Path) -> None:
        """Copy a directory of results written on a host to this machine (a no-op when it is the same path)."""

    @abc.abstractmethod
    def links(self, hosts: list[Host] | None = None) -> list[tuple[Host, str, str | None, str]]:
        """(host, direction, netns, ifname) of every shaped link end of all (or the given) hosts: direction is
        "upload" or "download"; netns is None for an interface in the host's root namespace."""

    @abc.abstractmethod
    def apply_shaping(self, shape: LinkShape, hosts: list[Host] | None = None, *, force: bool = False) -> list[dict]:
        """Shape both directions of every (or the given) host's link, all-or-nothing (a failure restores what each
        link had); with hosts=None it also becomes the cluster's recorded shaping. Returns what was applied."""

    @abc.abstractmethod
    def clear_shaping(self, hosts: list[Host] | None = None) -> None:
        """Remove the testbed's shaping from every (or the given) host's link, putting back what was there."""

    def recorded_shape(self) -> LinkShape | None:
        """The shaping the cluster was brought up with, or None: restored after each trial."""
        return None

    def shaping_peers(self, host: Host) -> tuple[str, ...]:
        """The CIDRs whose traffic `host`'s shaping applies to (shaping.classify); () means every packet (the
        emulated cluster, whose links carry nothing else)."""
        return ()

    @abc.abstractmethod
    def command_prefix(self, host: Host) -> list[str] | None:
        """An argv prefix that runs a command on `host` from this machine with the terminal handed over
        (`testbed exec`), or None when commands reach the host only through `run`."""

    @abc.abstractmethod
    def threads_per_rank(self, world_size: int) -> int:
        """CPU threads each rank of a `world_size`-rank trial should use (torch/OMP), or 0 for the host's default."""

    def end_leftover(self, handle: dict[str, Any]) -> bool:
        """End the process group a killed controller left running (`RankProcess.handle()`), only if it is still the
        same process; True when something was ended."""
        return False

    def rank_out_dir(self, local_dir: Path, trial_id: str) -> Path:
        """Where ranks write a trial's records on the hosts; `fetch` brings them to `local_dir`."""
        return local_dir

    @abc.abstractmethod
    def down(self) -> str:
        """Remove what the cluster made (processes, shaping, namespaces) and forget its record; what was done, in
        words."""

    @abc.abstractmethod
    def status(self) -> dict[str, Any]:
        """JSON-ready description: backend, hosts (name, address, data_iface, netns), shaping per link."""

    def host(self, name: str) -> Host:
        for h in self.hosts():
            if h.name == name:
                return h
        names = ", ".join(h.name for h in self.hosts())
        raise InputError(f"unknown host {name!r}; cluster {self.name!r} has: {names}")
