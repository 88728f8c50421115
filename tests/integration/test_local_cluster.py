"""The local emulated cluster on real namespaces: up/down with zero leftovers, reachability, idempotence, crash cleanup.

Every cluster has a unique name and a private state directory; the fixtures tear it down even when a test fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import (
    REPO,
    cluster_netns,
    kernel_has_netem,
    kill_pids,
    netns_list,
    one_line,
    pids_in_netns,
    random_suffix,
    wait_for,
)

pytestmark = pytest.mark.root


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def netns_names() -> list[str]:
    """The entries of /run/netns (cheap enough to poll every millisecond), [] before any namespace exists."""
    try:
        return os.listdir("/run/netns")
    except FileNotFoundError:
        return []


def status(testbed_cli, name: str) -> dict:
    done = testbed_cli("status", "--name", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ping(ns: str, address: str) -> bool:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", "-q", address], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.mark.parametrize("n_hosts", [2, 8])
def test_up_reach_down_leaves_nothing(testbed_cli, state_dir, cluster_name, n_hosts):
    name = cluster_name
    links_before = root_links()
    done = testbed_cli("up", "--name", name, "--hosts", str(n_hosts), "--bw", "1gbit")  # its timeout catches a hang
    assert done.returncode == 0, done.stderr
    assert f"{n_hosts} hosts up" in done.stdout

    # what exists: one namespace per host plus the switch, named as documented, with the addresses status reports
    expected_ns = sorted([f"tb-{name}-sw"] + [f"tb-{name}-h{i}" for i in range(n_hosts)])
    assert cluster_netns(name) == expected_ns
    st = status(testbed_cli, name)
    assert [h["name"] for h in st["hosts"]] == [f"h{i}" for i in range(n_hosts)]
    addresses = [h["address"] for h in st["hosts"]]
    assert len(set(addresses)) == n_hosts
    for h in st["hosts"]:
        assert h["netns"] == f"tb-{name}-{h['name']}" and h["data_iface"] == "eth0"
        addr = subprocess.run(
            ["ip", "-n", h["netns"], "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True, text=True
        ).stdout
        assert f"inet {h['address']}/24" in addr
        host_links = subprocess.run(["ip", "-n", h["netns"], "-o", "link"], capture_output=True, text=True).stdout
        assert sorted(line.split(":")[1].strip().split("@")[0] for line in host_links.splitlines()) == ["eth0", "lo"]
    assert not {"br0", "eth0"} & (root_links() - links_before), "up created links in the root namespace"

    # every host reaches every other host
    unreachable = [
        (a["name"], b["name"]) for a, b in itertools.permutations(st["hosts"], 2) if not ping(a["netns"], b["address"])
    ]
    assert not unreachable, f"unreachable pairs: {unreachable}"

    # a process left running inside a host must not survive down
    sleeper = subprocess.Popen(
        ["ip", "netns", "exec", f"tb-{name}-h{n_hosts - 1}", "sleep", "600"], start_new_session=True
    )
    try:
        wait_for(lambda: sleeper.pid in pids_in_netns(f"tb-{name}-h{n_hosts - 1}"), 10, "sleep inside the host")
        done = testbed_cli("down", "--name", name)
        assert done.returncode == 0, done.stderr
        assert f"removed {n_hosts + 1} namespaces" in done.stdout
        assert sleeper.wait(timeout=10) is not None  # down killed it
    finally:
        if sleeper.poll() is None:
            kill_pids([sleeper.pid])
            sleeper.wait(5)

    assert cluster_netns(name) == []
    assert not (state_dir / "clusters" / f"{name}.json").exists()
    assert (
        not list((state_dir / "qdisc-backup").glob(f"tb-{name}-*")) if (state_dir / "qdisc-backup").exists() else True
    )
    new_links = root_links() - links_before
    assert not {"br0", "eth0", *(f"h{i}" for i in range(n_hosts))} & new_links, new_links
    done = testbed_cli("status", "--name", name)
    assert done.returncode == 2 and "no cluster named" in one_line(done.stderr)


def test_down_is_idempotent(testbed_cli, cluster_name):
    done = testbed_cli("down", "--name", cluster_name)
    assert done.returncode == 0
    assert "not up; nothing to remove" in done.stdout


def test_up_identical_cluster_reports_it(testbed_cli, state_dir, cluster_name):
    name = cluster_name
    assert testbed_cli("up", "--name", name, "--hosts", "2", "--bw", "100mbit").returncode == 0
    record_before = (state_dir / "clusters" / f"{name}.json").read_text()
    inodes_before = {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in cluster_netns(name)}

    done = testbed_cli("up", "--name", name, "--hosts", "2", "--bw", "100mbit")
    assert done.returncode == 0, done.stderr
    assert "already up (same parameters)" in done.stdout
    done = testbed_cli("up", "--name", name, "--hosts", "2", "--bw", "100mbit", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["created"] is False
    # the very same namespaces and record: nothing was rebuilt
    assert {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in cluster_netns(name)} == inodes_before
    assert (state_dir / "clusters" / f"{name}.json").read_text() == record_before


def test_up_existing_cluster_with_other_parameters_refused(testbed_cli, state_dir, cluster_name):
    name = cluster_name
    assert testbed_cli("up", "--name", name, "--hosts", "2", "--bw", "100mbit").returncode == 0
    record_before = (state_dir / "clusters" / f"{name}.json").read_text()
    ns_before = netns_list()
    for flags in (["--hosts", "3", "--bw", "100mbit"], ["--hosts", "2", "--bw", "200mbit"], ["--hosts", "2"]):
        done = testbed_cli("up", "--name", name, *flags)
        assert done.returncode == 2, flags
        line = one_line(done.stderr)
        assert f"cluster '{name}' is already up with 2 hosts" in line and "--recreate" in line
        assert (state_dir / "clusters" / f"{name}.json").read_text() == record_before
        assert cluster_netns(name) == [n for n in ns_before if n.startswith(f"tb-{name}-")]
    # --recreate is the documented way through
    done = testbed_cli("up", "--name", name, "--hosts", "3", "--recreate")
    assert done.returncode == 0, done.stderr
    assert len(cluster_netns(name)) == 4


def test_exec_runs_in_the_host_namespace(testbed_cli, make_cluster):
    name = make_cluster(2)
    done = testbed_cli("exec", "--name", name, "h1", "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
    assert done.returncode == 0, done.stderr
    assert "10.77.0.2/24" in done.stdout
    done = testbed_cli("exec", "--name", name, "h9", "--", "true")
    assert done.returncode == 2 and "unknown host 'h9'" in one_line(done.stderr)


def test_down_after_sigkill_mid_up(cli_env, testbed_cli, state_dir):
    """`testbed up --hosts 8` killed with SIGKILL once its first namespace exists; `down` must remove everything.

    If `up` happens to finish before the kill lands, the attempt is repeated under a new name (up to 5 times), so the
    test really covers a half-built cluster; each attempt's cluster is removed whatever happens.
    """
    caught_mid_up = False
    for _attempt in range(5):
        name = "t" + random_suffix()
        proc = subprocess.Popen(
            [sys.executable, "-m", "testbed.cli", "up", "--name", name, "--hosts", "8", "--bw", "1gbit"],
            env=cli_env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            prefix = f"tb-{name}-"
            wait_for(
                lambda proc=proc, prefix=prefix: (
                    proc.poll() is not None or any(n.startswith(prefix) for n in netns_names())
                ),
                30,
                "the first namespace of the cluster",
                interval_s=0.001,
            )
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            caught_mid_up = (
                proc.returncode == -signal.SIGKILL and not (state_dir / "clusters" / f"{name}.json").exists()
            )
            leftovers = cluster_netns(name)
            done = testbed_cli("down", "--name", name)
            assert done.returncode == 0, done.stderr
            assert cluster_netns(name) == [], "down left namespaces of a killed up"
            assert not (state_dir / "clusters" / f"{name}.json").exists()
            if caught_mid_up:
                assert leftovers, "the killed up left nothing to clean: the kill came before any namespace"
                # the name is usable again
                done = testbed_cli("up", "--name", name, "--hosts", "2")
                assert done.returncode == 0, done.stderr
                assert testbed_cli("down", "--name", name).returncode == 0
                break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            for ns in cluster_netns(name):
                kill_pids(pids_in_netns(ns))
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
    assert caught_mid_up, "up finished before SIGKILL in 5 attempts: the half-built case was not exercised"


def test_failed_up_rolls_back_everything(testbed_cli, state_dir, cluster_name):
    """`up` whose shaping fails (here: --delay on a kernel without netem) leaves no namespace and no record."""
    if kernel_has_netem():
        pytest.skip("this kernel has netem, so --delay does not fail; the rollback is covered by test_shaping")
    done = testbed_cli("up", "--name", cluster_name, "--hosts", "2", "--bw", "100mbit", "--delay", "5ms")
    assert done.returncode == 1
    assert "netem" in one_line(done.stderr)
    assert cluster_netns(cluster_name) == []
    assert not (state_dir / "clusters" / f"{cluster_name}.json").exists()


def test_status_all_reports_a_broken_cluster_beside_the_others(make_cluster, testbed_cli):
    """A recorded cluster whose namespace was deleted by hand is named (exit 1) and does not hide the healthy one."""
    broken, fine = make_cluster(2), make_cluster(2)
    subprocess.run(["ip", "netns", "del", f"tb-{broken}-h1"], check=True)
    done = testbed_cli("status", "--all", "--json")
    assert done.returncode == 1, done.stderr
    data = {d["name"]: d for d in json.loads(done.stdout)}
    assert data[broken]["broken"] and f"testbed down --name {broken}" in data[broken]["error"]
    assert [h["name"] for h in data[fine]["hosts"]] == ["h0", "h1"]


def test_asking_a_gone_namespace_for_its_mark_does_not_create_it(cluster_name):
    """`testbed ls` and `down` list the namespaces, then ask each for its mark; one removed in between (by its own
    cluster's `down`, or a test's cleanup) must stay gone. pyroute2's IPRoute(netns=...) creates a missing namespace
    by default, and a full suite's listing once brought back a namespace another worker had just removed."""
    from pyroute2 import netns

    from testbed.cluster.local import namespace_mark

    name = f"tb-{cluster_name}-gone"
    try:
        assert namespace_mark(name) is None  # as `ls` finds it, listed a moment ago and removed since
        assert name not in netns.listnetns()
    finally:
        with contextlib.suppress(OSError):
            netns.remove(name)


def test_a_namespace_whose_first_create_failed_is_created_on_the_next_try(cluster_name):
    """pyroute2 creates /run/netns/NAME before it mounts the namespace there; when that mount fails (once in a full
    suite, under parallel namespace churn) the empty file stays and makes every later create of the name fail with
    "File exists". testbed.cluster.topology.create_namespace removes what the failed try left and tries again."""
    from pyroute2 import netns

    from testbed.cluster.topology import create_namespace

    name = f"tb-{cluster_name}-stale"
    path = f"/run/netns/{name}"
    os.makedirs("/run/netns", exist_ok=True)
    open(path, "x").close()  # what a failed create leaves: the mount point, no namespace on it
    try:
        with pytest.raises(FileExistsError):
            netns.create(name)  # the failure mode: every later create of the name
        create_namespace(name)
        done = subprocess.run(["ip", "netns", "exec", name, "ip", "-o", "link", "show", "lo"], capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert done.returncode == 0 and "lo" in done.stdout, done.stderr  # a real namespace, with its own loopback
    finally:
        with contextlib.suppress(OSError):
            netns.remove(name)
    assert name not in netns.listnetns()
