"""The Cluster interface is complete: both backends implement every method callers use (no `hasattr`, no
`backend == ...` tests), and the per-backend answers (command prefix, threads per rank) are what exec and the
launcher need. No root: clusters are built from records, nothing is brought up."""

from __future__ import annotations

import os

import pytest

from testbed.cluster.base import Cluster, Host
from testbed.cluster.lab.cluster import LabCluster
from testbed.cluster.lab.inventory import LabHostSpec
from testbed.cluster.local import LocalCluster
from testbed.cluster.ssh import SSHTarget

METHODS = (
    "hosts",
    "run",
    "start",
    "fetch",
    "links",
    "apply_shaping",
    "clear_shaping",
    "recorded_shape",
    "command_prefix",
    "threads_per_rank",
    "down",
    "status",
)


def local_cluster() -> LocalCluster:
    return LocalCluster(
        {
            "name": "ifc",
            "backend": "local",
            "subnet": "10.77.0.0/24",
            "shape": {
                "rate_bps": 10**8,
                "burst_bytes": 65536,
                "qdisc": "htb",
                "delay_s": 0.0,
                "jitter_s": 0.0,
                "loss_pct": 0.0,
            },
            "namespaces": ["tb-ifc-sw", "tb-ifc-h0"],
            "hosts": [
                {"name": "h0", "address": "10.77.0.1", "data_iface": "eth0", "netns": "tb-ifc-h0", "switch_port": "h0"}
            ],
        }
    )


def lab_cluster() -> LabCluster:
    spec = LabHostSpec("n1", SSHTarget("n1", "192.0.2.1"), "eth1", "192.0.2.11", 0, "python3", "/src", "/tmp/run")
    return LabCluster("labx", [spec])


def test_the_interface_declares_every_method_callers_use():
    for name in METHODS:
        assert hasattr(Cluster, name), name
    assert {"links", "apply_shaping", "clear_shaping", "command_prefix", "threads_per_rank", "down"} <= (
        Cluster.__abstractmethods__
    )


@pytest.mark.parametrize("make", [local_cluster, lab_cluster])
def test_backends_implement_it(make):
    cluster = make()  # instantiating proves no abstract method is left out
    assert isinstance(cluster, Cluster)


def test_local_answers():
    cluster = local_cluster()
    host = cluster.host("h0")
    prefix = cluster.command_prefix(host)  # setns from Python (netns_exec.py), no `ip` binary
    assert prefix[1:2] == ["-I"] and prefix[2].endswith("netns_exec.py") and prefix[3:] == ["/run/netns/tb-ifc-h0", "--"]
    assert cluster.threads_per_rank(1) == os.cpu_count()
    assert cluster.threads_per_rank(10_000) == 1  # never 0: 0 would mean "the default", every rank all CPUs
    assert cluster.recorded_shape().rate_bps == 10**8
    assert [(d, ns, ifn) for _, d, ns, ifn in cluster.links()] == [
        ("upload", "tb-ifc-h0", "eth0"),
        ("download", "tb-ifc-sw", "h0"),
    ]


def test_lab_answers():
    cluster = lab_cluster()
    host = Host("n1", "192.0.2.11", "eth1")
    assert cluster.command_prefix(host) is None  # exec goes through run (SSH)
    assert cluster.threads_per_rank(8) == 0
    assert cluster.recorded_shape() is None
