"""Open or remove a recorded cluster by name, whatever its backend.

The registry (registry.py) only stores records and locks; this module is the one place that maps a record's
`backend` to its class, so the backends can use the registry without the registry knowing them (no import cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.cluster import registry
from testbed.errors import InputError

if TYPE_CHECKING:
    from testbed.cluster.base import Cluster

# The backends are imported where they are used: pyroute2 and paramiko cost the CLI's start-up a quarter second.


def open_cluster(name: str) -> Cluster:
    """The backend object of a recorded cluster; InputError when no cluster of that name is up."""
    record = registry.load_record(name)
    if record is None:
        up = ", ".join(registry.recorded_names()) or "none"
        raise InputError(f"no cluster named {name!r} is up (clusters up: {up}); start one with `testbed up`")
    if record.get("backend") == "slurm":
        from testbed.cluster.slurm import SlurmCluster

        return SlurmCluster.from_record(record)
    if record.get("backend") == "lab":
        from testbed.cluster.lab.cluster import LabCluster

        return LabCluster.from_record(record)
    from testbed.cluster.local import LocalCluster

    return LocalCluster.from_record(record)


def all_cluster_names() -> list[str]:
    """Every cluster on this machine: recorded ones and local leftovers of a crashed `up` (found by prefix)."""
    from testbed.cluster.local import all_testbed_clusters

    names = all_testbed_clusters()
    return names + [n for n in registry.recorded_names() if n not in names]


def half_made_clusters(name: str | None = None) -> dict[str, list[str]]:
    """Cluster name -> its namespaces, for namespaces with a cluster's prefix but no cluster record (what an
    interrupted `up` or a lost state directory leaves behind; only the local backend makes namespaces). `testbed down
    --name NAME` removes them."""
    from testbed.cluster.local import all_testbed_clusters, cluster_namespaces

    recorded = set(registry.recorded_names())
    names = [name] if name is not None else all_testbed_clusters()
    out = {}
    for n in names:
        if n not in recorded:
            found = cluster_namespaces(n)
            if found:
                out[n] = found
    return out


def down(name: str) -> str | None:
    """Remove everything of cluster `name` (also a crashed local one's leftovers) and forget its record.
    Returns what was done in words, or None when there was nothing to remove."""
    registry.check_name(name)
    record = registry.load_record(name)
    if record is not None:
        return open_cluster(name).down()
    from testbed.cluster.local import LocalCluster

    removed = LocalCluster.remove(name)  # no record: leftovers of a crashed local `up`, if any
    return f"removed {len(removed)} namespaces" if removed else None
