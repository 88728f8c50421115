"""Lab shaping classifies the cluster's data traffic: default peers, `testbed_shaping_peers`, and the flags sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cluster.lab.cluster import LabCluster
from testbed.errors import InputError

INVENTORY = """
all:
  children:
    testbed:
      vars:
        testbed_data_iface: ens1f0
        ansible_ssh_common_args: -o UserKnownHostsFile=/etc/lab/known_hosts
      hosts:
        gpu01: {ansible_host: 192.0.2.11, testbed_data_address: 198.51.100.11}
        gpu02: {ansible_host: 192.0.2.12, testbed_data_address: 198.51.100.12}
        gpu03: {ansible_host: 192.0.2.13, testbed_data_address: 198.51.100.13%s}
"""


def _cluster(tmp_path: Path, extra: str = "") -> LabCluster:
    p = tmp_path / "inv.yml"
    p.write_text(INVENTORY % extra)
    return LabCluster.from_inventory(p)


def test_default_peers_are_the_other_hosts_data_addresses(tmp_path):
    c = _cluster(tmp_path)
    assert c.shaping_peers("gpu01") == ("198.51.100.12/32", "198.51.100.13/32")
    assert c._peer_flags("gpu02") == ["--peers", "198.51.100.11/32,198.51.100.13/32"]


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        (", testbed_shaping_peers: [198.51.100.0/24, 'fd00::/64']", ("198.51.100.0/24", "fd00::/64")),
        (", testbed_shaping_peers: '198.51.100.11,198.51.100.12'", ("198.51.100.11/32", "198.51.100.12/32")),
        (", testbed_shaping_peers: all", ()),
    ],
)
def test_inventory_sets_the_peers(tmp_path, extra, want):
    c = _cluster(tmp_path, extra)
    assert c.shaping_peers("gpu03") == want
    assert c._peer_flags("gpu03") == (["--peers", ",".join(want)] if want else [])
    assert c.shaping_peers("gpu01") == ("198.51.100.12/32", "198.51.100.13/32")  # the others keep the default


@pytest.mark.parametrize(
    ("extra", "why"),
    [(", testbed_shaping_peers: '198.51.100.1,'", "empty item"), (", testbed_shaping_peers: 5", "must be a list")],
)
def test_bad_peers_in_the_inventory(tmp_path, extra, why):
    with pytest.raises(InputError, match=why):
        _cluster(tmp_path, extra)


def test_inventory_offload_and_ingress(tmp_path):
    c = _cluster(tmp_path, ", testbed_shaping_offload: auto, testbed_shaping_ingress: false")
    assert c._peer_flags("gpu03") == ["--peers", "198.51.100.11/32,198.51.100.12/32", "--offload", "auto"]
    assert c.specs["gpu03"].shaping_ingress is False and c.specs["gpu01"].shaping_ingress is True
    with pytest.raises(InputError, match="testbed_shaping_offload 'maybe'"):
        _cluster(tmp_path, ", testbed_shaping_offload: maybe")
