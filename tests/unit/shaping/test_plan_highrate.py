"""High rates: HTB offload rendered, the offload decision, the ceilings' warnings and the ifb leaf size."""

from __future__ import annotations

import pytest

from shaping import highrate
from shaping.__main__ import main as shaping_main
from shaping.errors import InputError
from shaping.plan import LinkShape


def test_offload_lines_for_connectx():
    lines = highrate.render_offload("ens1f0np0", LinkShape(95 * 10**9), peers=("10.0.0.2/32", "fd00::/64"))
    assert lines == [
        "ethtool -K ens1f0np0 hw-tc-offload on",
        "tc qdisc replace dev ens1f0np0 root handle 7e57: htb offload",
        "tc class replace dev ens1f0np0 parent 7e57: classid 7e57:1 htb rate 95000000000bit ceil 95000000000bit",
        "tc qdisc replace dev ens1f0np0 clsact",
        "tc filter add dev ens1f0np0 egress protocol ip prio 32347 u32 match ip dst 10.0.0.2/32 "
        "action skbedit priority 7e57:1",
        "tc filter add dev ens1f0np0 egress protocol ipv6 prio 32349 u32 match ip6 dst fd00::/64 "
        "action skbedit priority 7e57:1",
    ]
    every = highrate.render_offload("eth0", LinkShape(10**9), netns="ns1")
    assert every[0] == "ip netns exec ns1 ethtool -K eth0 hw-tc-offload on"
    assert every[-1] == "tc -n ns1 filter add dev eth0 egress protocol all prio 32343 u32 match u32 0 0 " \
        "action skbedit priority 7e57:1"


@pytest.mark.parametrize(
    ("mode", "state", "want"),
    [("auto", "on", True), ("auto", "off", True), ("auto", "off [fixed]", False), ("auto", None, False),
     ("off", "on", False), ("on", "off", True)],
)  # fmt: skip
def test_offload_decision(mode, state, want):
    assert highrate.resolve_offload(mode, state, "eth0") is want


@pytest.mark.parametrize("state", ["off [fixed]", None])
def test_offload_on_refused_where_the_nic_cannot(state):
    with pytest.raises(InputError, match="cannot offload HTB"):
        highrate.resolve_offload("on", state, "eth0")


def test_offload_refuses_tbf_and_netem():
    with pytest.raises(InputError, match="only htb"):
        highrate.render_offload("eth0", LinkShape(10**9, qdisc="tbf"))
    with pytest.raises(InputError, match="netem"):
        highrate.render_offload("eth0", LinkShape(10**9, delay_s=0.001))


def test_warnings_name_the_ceiling_and_its_source():
    assert highrate.warnings_for(LinkShape(5 * 10**9), offload=False, ingress=True) == []
    (egress, ing) = highrate.warnings_for(LinkShape(40 * 10**9), offload=False, ingress=True)
    assert "egress at 40gbit is above 6.7gbit" in egress and "214baf22870c" in egress and "--offload on" in egress
    assert ing.startswith("warning: ingress (ifb, software) at 40gbit")
    assert highrate.warnings_for(LinkShape(95 * 10**9), offload=True, ingress=False) == []


def test_ifb_leaf_is_a_bandwidth_delay_product():
    assert highrate.leaf_limit_bytes(100 * 10**9, 12_500_000) == 62_500_000  # 5 ms at 100G
    assert highrate.leaf_limit_bytes(10 * 10**6, 65_536) == 131_072  # never below two buckets
    assert highrate.leaf_limit_bytes(10 * 10**6, 1_000_000) == 2_000_000
    # nor two GRO-merged 64 KB packets: the default bucket at 50 Mbit/s is 6.25 KB, and a 12.5 KB leaf dropped them
    assert highrate.leaf_limit_bytes(50 * 10**6, 6_250) == 131_072


def test_cli_offload_dry_run_and_refusals(capsys):
    assert shaping_main(["apply", "--dev", "lo", "--bw", "1gbit", "--offload", "sometimes", "--dry-run"]) == 2
    assert "--offload 'sometimes'" in capsys.readouterr().err
    assert shaping_main(["apply", "--dev", "lo", "--bw", "1gbit", "--offload", "on", "--dry-run"]) == 2
    assert "lo cannot offload HTB" in capsys.readouterr().err
    assert shaping_main(["apply", "--dev", "lo", "--bw", "40gbit", "--offload", "auto", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "htb offload" not in out.out and "above 6.7gbit" in out.err  # lo cannot: software htb, with a warning


def test_probe_processes_per_stream_before_iperf3_3_16():
    from testbed.probe import processes_for

    assert processes_for((3, 9), 8) == 8  # Ubuntu 22.04: every -P stream on one thread, so one process each
    assert processes_for(None, 4) == 4  # unknown version: the safe way
    assert processes_for((3, 16), 8) == 1 and processes_for((3, 9), 1) == 1
    # one thread carries a rate this low: one process, no summing over a common window
    assert processes_for((3, 9), 4, requested_bps=300e6) == 1
    assert processes_for((3, 9), 4, requested_bps=25e9) == 4 and processes_for((3, 9), 4, requested_bps=None) == 4
