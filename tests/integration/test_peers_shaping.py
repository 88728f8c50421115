"""Shaping only the cluster's data traffic (`--peers`): one link carrying two address pairs, as a lab host's data NIC
carries the cluster's traffic and storage or scheduler traffic beside it.

Two scratch namespaces joined by one veth pair, two IPv4 addresses on each end: 10.77.1.0/24 is the data pair (the
peers), 10.77.2.0/24 the other pair. `python -m shaping apply --peers` on one end (egress and ingress via ifb) must
throttle the data pair to the rate in both directions (iperf3, against the ideal TCP goodput) and leave the other pair
unshaped (clearly faster); clear restores both; a failed apply leaves the previous shaping, classifier included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO, kill_pids, one_line

from shaping import ingress, tc
from shaping.plan import LinkShape, ideal_goodput_bps

pytestmark = pytest.mark.root

RATE_BPS = 100_000_000
DATA_A, DATA_B = "10.77.1.1", "10.77.1.2"
OTHER_A, OTHER_B = "10.77.2.1", "10.77.2.2"


@pytest.fixture
def two_pairs(scratch_netns):
    a, b = scratch_netns(), scratch_netns()
    subprocess.run(["ip", "link", "add", "cla0", "netns", a, "type", "veth", "peer", "name", "clb0", "netns", b],
                   check=True)  # fmt: skip
    for ns, dev, addrs in ((a, "cla0", (DATA_A, OTHER_A)), (b, "clb0", (DATA_B, OTHER_B))):
        for addr in addrs:
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
    return a, b


def shaping_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "shaping", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)  # fmt: skip


def iperf(client_ns: str, server_ns: str, server_addr: str, *, reverse: bool = False) -> float:
    """Goodput (bits/s) of one 1.5 s TCP stream from client_ns to server_addr (reverse: server sends)."""
    port = "5299"
    server = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server_addr, "-p", port],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        argv = ["ip", "netns", "exec", client_ns, "iperf3", "-c", server_addr, "-p", port, "-t", "1.5", "-J"]
        for _ in range(50):  # the server binds within a moment; a refused connect is retried, not slept on blindly
            done = subprocess.run(argv + (["-R"] if reverse else []), capture_output=True, text=True, timeout=30)
            report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
            if done.returncode == 0 and "sum_received" in report.get("end", {}):
                return float(report["end"]["sum_received"]["bits_per_second"])
            if "Connection refused" not in done.stdout + done.stderr and "unable to connect" not in done.stdout:
                break
        raise AssertionError(f"iperf3 to {server_addr} failed: {done.stdout[-300:]} {done.stderr[-300:]}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
        kill_pids([server.pid]) if server.poll() is None else None


def measure(a: str, b: str) -> dict[str, float]:
    return {
        "data_up": iperf(a, b, DATA_B),
        "data_down": iperf(a, b, DATA_B, reverse=True),
        "other_up": iperf(a, b, OTHER_B),
        "other_down": iperf(a, b, OTHER_B, reverse=True),
    }


def assert_shaped(rate: float, what: str) -> None:
    """Throttled to the rate: never above it (the limiter is there), and not a unit off below it (bytes for bits:
    1/8; kbit: 1/1000). How close under the rate a flow comes is a measurement (bench/shaping_accuracy.py), not a test's:
    a full suite on 2 loaded cores got 0.79 of the ideal through the ifb once (2026-12-06), with the shaping right."""
    ratio = rate / ideal_goodput_bps(RATE_BPS)
    assert 0.5 <= ratio <= 1.05, f"{what}: {rate / 1e6:.1f} Mbit/s is {ratio:.2f} of the ideal goodput"


def assert_unshaped(rate: float, what: str) -> None:
    assert rate > 4 * RATE_BPS, f"{what}: {rate / 1e6:.1f} Mbit/s, expected far above the {RATE_BPS / 1e6:g} Mbit rate"


def test_peers_shape_the_data_pair_only_and_clear_restores_both(two_pairs):
    a, b = two_pairs
    done = shaping_cli("apply", "--netns", a, "--dev", "cla0", "--bw", str(RATE_BPS), "--ingress",
                       "--peers", f"{DATA_B}", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peers"] == [f"{DATA_B}/32"]
    shown = json.loads(shaping_cli("show", "--netns", a, "--dev", "cla0", "--json").stdout)
    assert shown["egress"]["peers"] == [f"{DATA_B}/32"] and shown["ingress"]["peers"] == [f"{DATA_B}/32"]
    assert shown["egress"]["rate_bps"] == RATE_BPS and shown["ingress"]["shaping"]["rate_bps"] == RATE_BPS
    text = shaping_cli("show", "--netns", a, "--dev", "cla0").stdout
    assert f"peers {DATA_B}/32 (other traffic unshaped)" in text
    # applying the same again changes nothing
    again = shaping_cli("apply", "--netns", a, "--dev", "cla0", "--bw", str(RATE_BPS), "--ingress",
                        "--peers", f"{DATA_B}/32", "--json")  # fmt: skip
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False

    got = measure(a, b)
    assert_shaped(got["data_up"], "data pair, egress (to the peer)")
    assert_shaped(got["data_down"], "data pair, ingress (from the peer, via ifb)")
    assert_unshaped(got["other_up"], "other pair, egress")
    assert_unshaped(got["other_down"], "other pair, ingress")

    done = shaping_cli("clear", "--netns", a, "--dev", "cla0", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changed"], done.stderr
    assert tc.show("cla0", netns=a)["ownership"] == "default"
    assert not ingress.show("cla0", netns=a)["active"]
    after = measure(a, b)
    assert_unshaped(after["data_up"], "data pair after clear, egress")
    assert_unshaped(after["data_down"], "data pair after clear, ingress")


def test_peers_changed_and_removed_in_place(two_pairs):
    """From match-all to peers and back (htb's default class changes: the root is rebuilt) and to other peers."""
    a, _ = two_pairs
    shape = LinkShape(RATE_BPS)
    tc.apply("cla0", shape, netns=a)
    assert tc.show("cla0", netns=a)["peers"] == []
    tc.apply("cla0", shape, netns=a, peers=(f"{DATA_B}/32", "10.77.3.0/24", "fd77::/64"))
    assert tc.show("cla0", netns=a)["peers"] == [f"{DATA_B}/32", "10.77.3.0/24", "fd77::/64"]
    tc.apply("cla0", shape, netns=a, peers=("10.77.3.0/24",))
    assert tc.show("cla0", netns=a)["peers"] == ["10.77.3.0/24"]
    tc.apply("cla0", shape, netns=a)
    assert tc.show("cla0", netns=a)["peers"] == []
    out = subprocess.run(["tc", "-n", a, "filter", "show", "dev", "cla0"], capture_output=True, text=True).stdout
    assert out.strip() == "", out
    ingress.apply("cla0", shape, netns=a, peers=("fd77::/64", f"{DATA_B}/32"))
    assert ingress.show("cla0", netns=a)["peers"] == [f"{DATA_B}/32", "fd77::/64"]
    ingress.apply("cla0", shape, netns=a)
    assert ingress.show("cla0", netns=a)["peers"] == [] and ingress.show("cla0", netns=a)["active"]
    assert ingress.clear("cla0", netns=a) and tc.clear("cla0", netns=a)


def test_a_failed_apply_rolls_back_rate_and_classifier(two_pairs, monkeypatch):
    a, b = two_pairs
    tc.apply("cla0", LinkShape(RATE_BPS), netns=a, peers=(f"{DATA_B}/32",))
    real = tc._add_peer_filter
    calls = []

    def fail_on_second(ipr, index, cidr):
        calls.append(cidr)
        if len(calls) == 2:
            from pyroute2.netlink.exceptions import NetlinkError

            raise NetlinkError(1, "injected")  # EPERM, after the rate and the first filter have changed
        return real(ipr, index, cidr)

    monkeypatch.setattr(tc, "_add_peer_filter", fail_on_second)
    with pytest.raises(Exception, match="needs root or CAP_NET_ADMIN"):
        tc.apply("cla0", LinkShape(2 * RATE_BPS), netns=a, peers=("10.77.2.2/32", "10.77.3.0/24"))
    monkeypatch.setattr(tc, "_add_peer_filter", real)
    shown = tc.show("cla0", netns=a)
    assert shown["owned"] and shown["rate_bps"] == RATE_BPS and shown["peers"] == [f"{DATA_B}/32"]
    assert_shaped(iperf(a, b, DATA_B), "data pair after the rolled-back apply")
    assert_unshaped(iperf(a, b, OTHER_B), "other pair after the rolled-back apply")


def test_bad_peers_refused_before_anything_changes(two_pairs):
    a, _ = two_pairs
    for peers, why in (("10.77.1.2,", "empty item"), ("10.77.1.300", "not an address or CIDR")):
        done = shaping_cli("apply", "--netns", a, "--dev", "cla0", "--bw", "1gbit", "--peers", peers)
        assert done.returncode == 2 and why in one_line(done.stderr)
    done = shaping_cli("apply", "--netns", a, "--dev", "cla0", "--bw", "1gbit", "--qdisc", "tbf", "--peers", DATA_B)
    assert done.returncode == 2 and "classless" in one_line(done.stderr)
    assert tc.show("cla0", netns=a)["ownership"] == "default"


def test_ifb_gets_the_nics_queues_and_a_bdp_leaf(scratch_netns):
    """The ingress ifb: as many queues as the NIC and a bfifo leaf sized to 5 ms at the rate (not 32 packets)."""
    ns = scratch_netns()
    subprocess.run(["ip", "-n", ns, "link", "add", "q0", "numtxqueues", "4", "numrxqueues", "4", "type", "veth",
                    "peer", "name", "q1"], check=True)  # fmt: skip
    done = shaping_cli("apply", "--netns", ns, "--dev", "q0", "--bw", "1gbit", "--ingress", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ingress"]["leaf_limit_bytes"] == 625_000
    link = subprocess.run(["ip", "-n", ns, "-d", "link", "show", "ifb-q0"], capture_output=True, text=True).stdout
    assert "numtxqueues 4 " in link
    qd = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "ifb-q0"], capture_output=True, text=True).stdout
    assert "qdisc bfifo 7e59: parent 7e57:1 limit 625000b" in qd
    assert shaping_cli("clear", "--netns", ns, "--dev", "q0").returncode == 0


def test_local_cluster_shapes_every_byte_and_says_so(testbed_cli, make_cluster):
    """The emulated cluster keeps shaping every byte (no peers: no classifier), and status/--dry-run say so."""
    name = make_cluster(2, "--bw", "100mbit")
    st = testbed_cli("status", "--name", name, "--json")
    assert st.returncode == 0, st.stderr
    for h in json.loads(st.stdout)["hosts"]:
        assert h["links"]["upload"]["peers"] == [] and h["links"]["download"]["peers"] == []
    text = testbed_cli("status", "--name", name)
    assert text.returncode == 0 and "shaped traffic" in text.stdout and "all traffic" in text.stdout, text.stdout
    dry = testbed_cli("shape", "--name", name, "--bw", "200mbit", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("# upload") == 2 and " filter " not in dry.stdout and "default 1" in dry.stdout


def test_kernel_check_reports_the_leaf_qdiscs(scratch_netns):
    """kernel-check says whether bfifo (the ifb's leaf) and fq_codel exist, as the tc binary finds them."""
    done = shaping_cli("kernel-check", "--json")
    assert done.returncode == 0, done.stderr
    features = json.loads(done.stdout)["features"]
    assert features["bfifo"] is True
    ns = scratch_netns()
    subprocess.run(["ip", "-n", ns, "link", "add", "k0", "type", "veth", "peer", "name", "k1"], check=True)
    tc_says = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "k0", "root", "fq_codel"], capture_output=True)
    assert features["fq_codel"] is (tc_says.returncode == 0)
