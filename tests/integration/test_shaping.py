"""Shaping on real qdiscs: read-back on both ends, live re-shape cross-checked with the `tc` binary, dry-run, ownership
(foreign root refused, --force saves it, --clear restores it), rollback of failed applies, and bad input on a live
cluster. The kernel's view is always read with the `tc` binary, independently of the pyroute2 code under test.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
from conftest import NO_NETEM_REASON, cluster_netns, kernel_has_netem, netns_list, one_line, random_suffix

from shaping import commit_confirm, ingress, tc
from shaping.plan import LinkShape, default_burst_bytes, render_clear, render_tc
from testbed.cluster import backends
from testbed.errors import InputError

pytestmark = pytest.mark.root

_TC_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def tc_rate_bps(text: str) -> int:
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)bit", text)
    assert m, f"unexpected tc rate {text!r}"
    return round(float(m.group(1)) * _TC_UNITS[m.group(2)])


def tc_out(*args: str) -> str:
    return subprocess.run(["tc", *args], capture_output=True, text=True, check=True).stdout


def tc_root(ns: str, dev: str) -> dict:
    """The root qdisc as the tc binary reports it (JSON)."""
    for q in json.loads(tc_out("-j", "-n", ns, "qdisc", "show", "dev", dev)):
        if q.get("root"):
            return q
    raise AssertionError(f"no root qdisc on {ns}/{dev}")


def tc_htb_class(ns: str, dev: str) -> dict | None:
    """The testbed's class 7e57:1 as the tc binary prints it: rate, ceil (bits/s) and burst (bytes)."""
    for line in tc_out("-n", ns, "class", "show", "dev", dev).splitlines():
        if line.startswith("class htb 7e57:1 "):
            m = re.search(r" rate (\S+) ceil (\S+) burst (\d+)b ", line)
            assert m, line
            return {"rate_bps": tc_rate_bps(m.group(1)), "ceil_bps": tc_rate_bps(m.group(2)), "burst": int(m.group(3))}
    return None


def links(name: str, n_hosts: int = 2) -> list[tuple[str, str]]:
    """(namespace, device) of both ends of every host's link: host side (upload), switch side (download)."""
    out = []
    for i in range(n_hosts):
        out += [(f"tb-{name}-h{i}", "eth0"), (f"tb-{name}-sw", f"h{i}")]
    return out


def kernel_state(name: str, n_hosts: int = 2) -> list[str]:
    """Every qdisc and class line on every link of the cluster, without counters: what 'nothing changed' compares."""
    lines = []
    for ns, dev in links(name, n_hosts):
        for what in ("qdisc", "class"):
            for line in tc_out("-n", ns, what, "show", "dev", dev).splitlines():
                lines.append(f"{ns}/{dev}: " + re.sub(r" (refcnt|direct_packets_stat) \d+", "", line.strip()))
    return lines


def burst_tolerance(rate_bps: int) -> int:
    """The kernel keeps the bucket as a time in whole microseconds: read-back is exact to a few microseconds of data."""
    return int(3 * rate_bps / 8 / 1e6) + 16


def assert_htb_everywhere(name: str, rate_bps: int, burst: int, n_hosts: int = 2) -> None:
    for ns, dev in links(name, n_hosts):
        root = tc_root(ns, dev)
        assert (root["kind"], root["handle"]) == ("htb", "7e57:"), f"{ns}/{dev}: {root}"
        cls = tc_htb_class(ns, dev)
        assert cls is not None, f"{ns}/{dev}: no class 7e57:1"
        assert cls["rate_bps"] == cls["ceil_bps"] == rate_bps, f"{ns}/{dev}: {cls}"
        assert abs(cls["burst"] - burst) <= burst_tolerance(rate_bps), f"{ns}/{dev}: burst {cls['burst']} != {burst}"


def status(testbed_cli, name: str) -> dict:
    """What `testbed status --json` prints, read in-process (same code, without a Python start per call)."""
    return json.loads(json.dumps(backends.open_cluster(name).status()))


def test_status_cli_matches_in_process(testbed_cli, make_cluster):
    name = make_cluster(2, "--bw", "1gbit")
    done = testbed_cli("status", "--name", name, "--json")
    assert done.returncode == 0, done.stderr
    cli_view, api_view = json.loads(done.stdout), status(testbed_cli, name)
    assert cli_view.pop("in_use_by") is None  # the CLI adds who holds the cluster's lease: nobody now
    for view in (cli_view, api_view):  # counters move; the rest must be identical
        for link in all_link_status(view):
            for counter in ("sent_bytes", "sent_packets", "drops", "overlimits"):
                link.pop(counter)
    assert cli_view == api_view


def all_link_status(st: dict) -> list[dict]:
    return [h["links"][d] for h in st["hosts"] for d in ("upload", "download")]


# ---------------------------------------------------------------------------------------------- read-back
READBACK = [
    (["--bw", "1gbit"], "htb", 10**9, 125_000),
    (["--bw", "250mbit", "--burst", "100kb"], "htb", 250 * 10**6, 100_000),
    (["--bw", "9.5gbit"], "htb", 9_500_000_000, 1_187_500),
    (["--bw", "300mbit", "--qdisc", "tbf"], "tbf", 300 * 10**6, 37_500),  # the default: 1 ms of data
    (["--bw", "20gbit", "--qdisc", "tbf", "--burst", "1mib"], "tbf", 20 * 10**9, 1_048_576),
]


def assert_readback(testbed_cli, name: str, qdisc: str, rate_bps: int, burst: int) -> None:
    st = status(testbed_cli, name)
    assert st["shape"]["rate_bps"] == rate_bps and st["shape"]["burst_bytes"] == burst
    for link in all_link_status(st):
        assert link["owned"] and link["ownership"] == "owned"
        assert link["qdisc"] == qdisc
        assert link["rate_bps"] == rate_bps
        assert abs(link["burst_bytes"] - burst) <= burst_tolerance(rate_bps), link
    # the same seen by the tc binary
    for ns, dev in links(name):
        root = tc_root(ns, dev)
        assert (root["kind"], root["handle"]) == (qdisc, "7e57:")
        if qdisc == "htb":
            cls = tc_htb_class(ns, dev)
            assert cls["rate_bps"] == rate_bps
            assert abs(cls["burst"] - burst) <= burst_tolerance(rate_bps)
        else:
            assert root["options"]["rate"] * 8 == rate_bps
            assert abs(root["options"]["burst"] - burst) <= burst_tolerance(rate_bps)


def test_readback_equals_request_on_both_ends(testbed_cli, make_cluster):
    """`up` with a shape, then `shape` through the other cases: status and the tc binary both read what was asked."""
    flags, qdisc, rate_bps, burst = READBACK[0]
    name = make_cluster(2, *flags)
    assert_readback(testbed_cli, name, qdisc, rate_bps, burst)
    for flags, qdisc, rate_bps, burst in READBACK[1:]:
        done = testbed_cli("shape", "--name", name, *flags)
        assert done.returncode == 0, (flags, done.stderr)
        assert_readback(testbed_cli, name, qdisc, rate_bps, burst)


def test_100g_htb_plan_in_the_kernel(make_cluster):
    """64-bit HTB rate and a 12.5 MB bucket actually land in the kernel (pyroute2 sends TCA_HTB_RATE64)."""
    name = make_cluster(2, "--bw", "100gbit")
    assert_htb_everywhere(name, 100 * 10**9, 12_500_000)


# ---------------------------------------------------------------------------------------------- live re-shape
def test_live_reshape_changes_the_kernels_qdisc(testbed_cli, make_cluster):
    name = make_cluster(2, "--bw", "100mbit")
    assert_htb_everywhere(name, 10**8, default_burst_bytes(10**8))

    done = testbed_cli("shape", "--name", name, "--bw", "300mbit")
    assert done.returncode == 0, done.stderr
    assert_htb_everywhere(name, 3 * 10**8, default_burst_bytes(3 * 10**8))
    assert status(testbed_cli, name)["shape"]["rate_bps"] == 3 * 10**8

    done = testbed_cli("shape", "--name", name, "--bw", "2gbit", "--burst", "1mb")
    assert done.returncode == 0, done.stderr
    assert_htb_everywhere(name, 2 * 10**9, 1_000_000)

    done = testbed_cli("shape", "--name", name, "--bw", "500mbit", "--qdisc", "tbf")
    assert done.returncode == 0, done.stderr
    for ns, dev in links(name):
        root = tc_root(ns, dev)
        assert (root["kind"], root["handle"], root["options"]["rate"] * 8) == ("tbf", "7e57:", 5 * 10**8)
        assert tc_htb_class(ns, dev) is None

    done = testbed_cli("shape", "--name", name, "--bw", "700mbit", "--hosts", "h1")
    assert done.returncode == 0, done.stderr
    assert tc_root(f"tb-{name}-h0", "eth0")["options"]["rate"] * 8 == 5 * 10**8  # h0 untouched
    assert tc_htb_class(f"tb-{name}-h1", "eth0")["rate_bps"] == 7 * 10**8
    assert tc_htb_class(f"tb-{name}-sw", "h1")["rate_bps"] == 7 * 10**8

    done = testbed_cli("shape", "--name", name, "--clear")
    assert done.returncode == 0, done.stderr
    for ns, dev in links(name):
        root = tc_root(ns, dev)
        assert root["handle"] == "0:" and root["kind"] == "noqueue", f"{ns}/{dev}: {root}"
    st = status(testbed_cli, name)
    assert st["shape"] is None
    assert not any(link["owned"] for link in all_link_status(st))


def test_dry_run_changes_nothing(testbed_cli, make_cluster):
    name = make_cluster(2, "--bw", "100mbit")
    before = kernel_state(name)
    done = testbed_cli("shape", "--name", name, "--bw", "100gbit", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "rate 100000000000bit ceil 100000000000bit burst 12500000b" in done.stdout
    assert kernel_state(name) == before


@pytest.mark.parametrize(
    "shape",
    [LinkShape(100 * 10**9), LinkShape(10**9, burst_bytes=15_000), LinkShape(20 * 10**9, qdisc="tbf")],
    ids=["htb-100g", "htb-1g-15kb", "tbf-20g"],
)
def test_dry_run_lines_are_what_apply_does(scratch_netns, shape):
    """Run the --dry-run lines with the tc binary on a veth; the read-back equals what `apply` would set."""
    ns = scratch_netns()
    subprocess.run(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True)
    for line in render_tc("va", shape, ns):
        subprocess.run(shlex.split(line), check=True, capture_output=True)
    got = tc.show("va", netns=ns)
    assert got["owned"] and got["qdisc"] == shape.qdisc
    assert got["rate_bps"] == shape.rate_bps
    assert abs(got["burst_bytes"] - shape.effective_burst_bytes) <= burst_tolerance(shape.rate_bps)
    tc.apply("va", shape, netns=ns)  # the same through pyroute2 (replaces ours in place)
    again = tc.show("va", netns=ns)
    assert again["rate_bps"] == got["rate_bps"]  # tc and pyroute2 round the bucket time each their own way:
    assert abs(again["burst_bytes"] - got["burst_bytes"]) <= burst_tolerance(shape.rate_bps)
    for line in render_clear("va", ns):
        subprocess.run(shlex.split(line), check=True, capture_output=True)
    assert tc.show("va", netns=ns)["ownership"] == "default"


# ---------------------------------------------------------------------------------------------- ownership
def test_foreign_root_refused_then_forced_then_restored(testbed_cli, state_dir, make_cluster):
    name = make_cluster(2, "--bw", "100mbit")
    h1 = f"tb-{name}-h1"
    subprocess.run(["tc", "-n", h1, "qdisc", "del", "dev", "eth0", "root"], check=True)
    subprocess.run(
        ["tc", "-n", h1, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "50mbit", "burst",
         "32kb", "latency", "10ms"],
        check=True,
    )  # fmt: skip
    foreign = tc_root(h1, "eth0")
    before = kernel_state(name)

    # refused without --force: exit 2, one line, nothing changed (h0's links were shaped first, then rolled back)
    done = testbed_cli("shape", "--name", name, "--bw", "200mbit")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"{h1}/eth0 has a root qdisc the testbed did not create (tbf 1:)" in line and "--force" in line
    assert kernel_state(name) == before
    assert status(testbed_cli, name)["shape"]["rate_bps"] == 10**8

    # --force replaces it and saves it
    done = testbed_cli("shape", "--name", name, "--bw", "200mbit", "--force")
    assert done.returncode == 0, done.stderr
    assert_htb_everywhere(name, 2 * 10**8, default_burst_bytes(2 * 10**8))
    backup = state_dir / "qdisc-backup" / f"{h1}__eth0.json"
    assert backup.exists()

    # --clear removes ours and puts the foreign qdisc back, exactly
    done = testbed_cli("shape", "--name", name, "--clear")
    assert done.returncode == 0, done.stderr
    assert tc_root(h1, "eth0") == foreign
    assert not backup.exists()
    for ns, dev in links(name):
        if (ns, dev) != (h1, "eth0"):
            assert tc_root(ns, dev)["handle"] == "0:"

    # forced again, then down: the cluster's saved copies go with it
    assert testbed_cli("shape", "--name", name, "--bw", "200mbit", "--force").returncode == 0
    assert backup.exists()
    assert testbed_cli("down", "--name", name).returncode == 0
    assert not backup.exists() and cluster_netns(name) == []


def test_forced_foreign_tree_with_classes_and_leaf_qdisc_restored(scratch_netns, state_dir):
    """A whole foreign htb tree (nested classes, a leaf qdisc) is refused, then saved by force, then replayed."""
    ns = scratch_netns()
    subprocess.run(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", "va", "up"], check=True)
    for cmd in (
        "qdisc add dev va root handle 1: htb default 10",
        "class add dev va parent 1: classid 1:1 htb rate 50mbit quantum 6000",
        "class add dev va parent 1:1 classid 1:10 htb rate 30mbit ceil 40mbit burst 20k quantum 3000",
        "class add dev va parent 1:1 classid 1:20 htb rate 10mbit quantum 1500",
        "qdisc add dev va parent 1:10 handle 10: tbf rate 20mbit burst 32kb latency 20ms",
    ):
        subprocess.run(["tc", "-n", ns, *cmd.split()], check=True, capture_output=True)

    def tree() -> list[str]:
        return sorted(
            re.sub(r" refcnt \d+", "", line.strip())
            for what in ("qdisc", "class")
            for line in tc_out("-n", ns, what, "show", "dev", "va").splitlines()
        )

    before = tree()
    with pytest.raises(tc.ForeignQdiscError, match=r"htb 1:"):
        tc.apply("va", LinkShape(10**8), netns=ns)
    assert tree() == before
    assert tc.apply("va", LinkShape(10**8), netns=ns, force=True, state_dir=state_dir)["replaced_foreign"]
    assert (state_dir / "qdisc-backup" / f"{ns}__va.json").exists()  # saved where the caller said
    assert tc.show("va", netns=ns)["owned"]
    assert tc.clear("va", netns=ns, state_dir=state_dir)
    assert tree() == before
    assert not (state_dir / "qdisc-backup" / f"{ns}__va.json").exists()
    assert tc.clear("va", netns=ns, state_dir=state_dir) is False  # idempotent, and a foreign root is left alone


# ---------------------------------------------------------------------------------------------- rollback
def test_rollback_when_a_later_link_fails(testbed_cli, make_cluster):
    """A foreign qdisc on the last link (switch side of h1): three links are changed, then all put back."""
    name = make_cluster(2, "--bw", "100mbit", "--burst", "80kb")
    sw = f"tb-{name}-sw"
    subprocess.run(["tc", "-n", sw, "qdisc", "del", "dev", "h1", "root"], check=True)
    subprocess.run(["tc", "-n", sw, "qdisc", "add", "dev", "h1", "root", "handle", "2:", "htb"], check=True)
    before = kernel_state(name)
    done = testbed_cli("shape", "--name", name, "--bw", "300mbit", "--burst", "200kb")
    assert done.returncode == 2
    assert f"{sw}/h1 has a root qdisc the testbed did not create" in one_line(done.stderr)
    assert kernel_state(name) == before
    for ns, dev in links(name)[:3]:
        cls = tc_htb_class(ns, dev)
        assert cls["rate_bps"] == 10**8 and abs(cls["burst"] - 80_000) <= burst_tolerance(10**8)


def test_failed_netem_apply_keeps_previous_shaping(testbed_cli, make_cluster):
    """--delay on a kernel without netem: clear error naming netem, every link keeps its previous shaping."""
    if kernel_has_netem():
        pytest.skip("this kernel has netem: --delay succeeds, so there is no failing apply to roll back")
    name = make_cluster(2, "--bw", "100mbit")
    before = kernel_state(name)
    record_before = status(testbed_cli, name)["shape"]
    for flags in (["--delay", "5ms"], ["--loss", "1%"]):
        done = testbed_cli("shape", "--name", name, "--bw", "200mbit", *flags)
        # a kernel failure during the work (exit 1 by the error hierarchy), rolled back; not bad input (exit 2)
        assert done.returncode == 1, flags
        line = one_line(done.stderr)
        assert "netem" in line and "this kernel lacks" in line
        assert kernel_state(name) == before, flags
        assert_htb_everywhere(name, 10**8, default_burst_bytes(10**8))
        assert status(testbed_cli, name)["shape"] == record_before


@pytest.mark.skipif("not kernel_has_netem()", reason=NO_NETEM_REASON)
def test_netem_delay_adds_round_trip_time(testbed_cli, make_cluster):
    name = make_cluster(2, "--bw", "100mbit", "--delay", "20ms")
    done = testbed_cli("exec", "--name", name, "h0", "--", "ping", "-c", "3", "-i", "0.2", "-q", "10.77.0.2")
    assert done.returncode == 0, done.stderr
    avg_ms = float(re.search(r"= [\d.]+/([\d.]+)/", done.stdout).group(1))
    assert 38 <= avg_ms <= 50  # 20 ms on each end of the path
    st = status(testbed_cli, name)
    assert all(abs(link["netem"]["delay_s"] - 0.02) < 1e-4 for link in all_link_status(st))


# ---------------------------------------------------------------------------------------------- bad input, live
BAD_ON_LIVE_CLUSTER = [  # the parsing cases are covered in-process by tests/unit/testbed/test_cli_input.py
    (["shape", "--bw", "9gbps"], "ambiguous unit"),
    (["shape", "--bw", "0"], "out of range"),
    (["shape", "--bw", "garbage"], "not a number"),
    (["shape", "--qdisc", "tbf", "--bw", "40gbit"], "32-bit"),
    (["shape", "--bw", "1gbit", "--hosts", "h5"], "unknown host 'h5'"),
    (["up", "--hosts", "0"], "--hosts 0"),
    (["up", "--hosts", "3", "--bw", "100mbit"], "is already up"),
]


def test_bad_input_on_a_live_cluster_changes_nothing(testbed_cli, state_dir, make_cluster):
    name = make_cluster(2, "--bw", "100mbit")
    not_up = "t" + random_suffix()
    record = state_dir / "clusters" / f"{name}.json"

    def snapshot():  # other clusters come and go on a shared machine: look at ours and at the names used
        return (
            [n for n in netns_list() if n.startswith((f"tb-{name}-", f"tb-{not_up}-", "tb-BAD-NAME-"))],
            kernel_state(name),
            record.read_text(),
            sorted(p.name for p in (state_dir / "clusters").iterdir()),
        )

    before = snapshot()
    for argv, why in BAD_ON_LIVE_CLUSTER:
        done = testbed_cli(argv[0], "--name", name, *argv[1:])
        assert done.returncode == 2, argv
        line = one_line(done.stderr)
        assert why in line, (argv, line)
        assert snapshot() == before, argv
    for argv, why in ((["shape", "--name", "BAD-NAME", "--bw", "1gbit"], "cluster names are 1-10 characters"),
                      (["up", "--name", "BAD-NAME", "--hosts", "2"], "cluster names are 1-10 characters"),
                      (["shape", "--name", not_up, "--bw", "1gbit"], f"no cluster named '{not_up}' is up")):  # fmt: skip
        done = testbed_cli(*argv)
        assert done.returncode == 2 and why in one_line(done.stderr), argv
        assert snapshot() == before, argv


def test_api_rejects_unknown_interface_and_namespace(scratch_netns):
    ns = scratch_netns()
    # one lookup (shaping.netns_route.interface_index) for egress, ingress and the commit-confirm check: each names the
    # interfaces the namespace has (a scratch one: loopback alone)
    unknown = f"no interface 'nope0' in namespace {ns}; there are: lo"
    for call in (lambda: tc.apply("nope0", LinkShape(10**8), netns=ns),
                 lambda: ingress.apply("nope0", LinkShape(10**8), netns=ns),
                 lambda: commit_confirm.check_device("nope0", ns)):  # fmt: skip
        with pytest.raises(InputError) as raised:
            call()
        assert str(raised.value) == unknown
    missing = ns + "x"  # never created; looking into it must not create it either
    for call in (lambda: tc.show("lo", netns=missing), lambda: tc.apply("lo", LinkShape(10**8), netns=missing)):
        try:
            with pytest.raises(InputError, match="does not exist"):
                call()
        finally:
            created = missing in netns_list()
            if created:
                subprocess.run(["ip", "netns", "delete", missing], capture_output=True, check=False)
        assert not created, "looking into a missing namespace created it"


def test_status_of_a_damaged_cluster_does_not_recreate_namespaces(testbed_cli, make_cluster):
    name = make_cluster(2)
    subprocess.run(["ip", "netns", "delete", f"tb-{name}-h1"], check=True)
    done = testbed_cli("status", "--name", name)
    assert done.returncode == 2
    assert f"network namespace 'tb-{name}-h1' does not exist" in one_line(done.stderr)
    assert cluster_netns(name) == [f"tb-{name}-h0", f"tb-{name}-sw"]
