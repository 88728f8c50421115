"""Lab backend end to end against namespaced sshd hosts (tests/integration/labhosts.py): real SSH, real Ansible,
real qdiscs, iperf3 between hosts. Needs root, sshd, iperf3 and ansible-playbook."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labhosts import PYTHON, REPO, create_lab_hosts, wait_for

from shaping.plan import LinkShape, ideal_goodput_bps
from testbed.errors import ClusterError, InputError, ShapingError

ANSIBLE_PLAYBOOK = Path(PYTHON).parent / "ansible-playbook"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces, veths, qdiscs"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server (/usr/sbin/sshd)"),
    pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3"),
    pytest.mark.xdist_group("test_lab"),  # the module's lab (3 namespaced sshd hosts) on one xdist worker
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hosts = create_lab_hosts(tmp_path_factory.mktemp("lab"), n_hosts=3)
    try:
        yield hosts
    finally:
        problems = hosts.teardown()
        assert not problems, problems


@pytest.fixture
def cluster(lab):
    from testbed.cluster.lab.cluster import LabCluster

    c = LabCluster.from_inventory(lab.write_inventory())
    try:
        yield c
    finally:
        c.clear_shaping()
        c.close()


def _playbook(lab, name: str, *extra: str, inventory: Path | None = None) -> subprocess.CompletedProcess:
    """Run a playbook against h0 and h1 (the iperf3 pair; a third host would only add minutes on 2 cores)."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not installed in the venv (pip install 'ansible-core<2.21')")
    argv = [
        str(ANSIBLE_PLAYBOOK),
        "-i",
        str(inventory or lab.write_inventory()),
        str(REPO / "ansible" / "playbooks" / name),
    ]
    return subprocess.run(
        [*argv, "--limit", "h0,h1", *extra], capture_output=True, text=True, env=lab.ansible_env(), timeout=240
    )


def _tc_qdiscs(lab, h) -> str:
    return lab.netns_exec(h, "tc", "qdisc", "show").stdout


def _iperf(lab, client, server, seconds: float = 2.0) -> float:
    srv = subprocess.Popen(
        ["ip", "netns", "exec", server.ns, "iperf3", "-s", "-1", "-B", server.data_addr, "-p", "5299"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: ":5299 " in lab.netns_exec(server, "ss", "-ltnH").stdout or srv.poll() is not None,
            10,
            "iperf3 server to listen",
        )
        out = lab.netns_exec(
            client, "iperf3", "-J", "-c", server.data_addr, "-p", "5299", "-t", str(seconds), "-O", "0.5", timeout=60
        )
        assert out.returncode == 0, out.stderr or out.stdout
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"]
    finally:
        if srv.poll() is None:
            os.killpg(srv.pid, 9)
        srv.wait(timeout=10)


def test_provision_with_ansible_and_shape_refuses_gbps(lab):
    """provision.yml over real SSH writes each host's NCCL environment; shape.yml refuses 9gbps and shapes nothing.
    (Apart from the shaping test below: the 5 playbook runs of both took 233-297 s on a loaded machine.)"""
    prov = _playbook(lab, "provision.yml")
    assert prov.returncode == 0, prov.stdout[-3000:] + prov.stderr[-2000:]
    for h in lab.hosts[:2]:
        env_file = lab.tmp / "etc" / f"{h.name}-nccl.env"
        assert "NCCL_SOCKET_IFNAME==data0" in env_file.read_text()

    refused = _playbook(lab, "shape.yml", "-e", "rate=9gbps")  # an ambiguous unit: refused, nothing shaped
    assert refused.returncode != 0
    assert "ambiguous unit" in refused.stdout
    assert "7e57" not in _tc_qdiscs(lab, lab.hosts[0])


def test_shape_iperf_teardown_with_ansible(lab):
    """shape.yml over real SSH (it needs no provision: the hosts run the checkout's python -m shaping); iperf3 h0->h1
    is held to the rate (at most 1.05 of it: the limiter is there) and is not off by a unit (at least half the ideal
    goodput: bytes for bits would be 1/8); how close it comes is bench/shaping_accuracy.py's figure, not a test's, as
    a loaded machine can miss any closer bound; shape.yml again is unchanged; teardown.yml leaves no testbed qdisc."""
    rate = 50_000_000
    shape = _playbook(lab, "shape.yml", "-e", "rate=50mbit")
    assert shape.returncode == 0, shape.stdout[-3000:] + shape.stderr[-2000:]
    assert "changed=" in shape.stdout and "failed=0" in shape.stdout
    assert "7e57" not in _tc_qdiscs(lab, lab.hosts[2])  # --limit h0,h1
    for h in lab.hosts[:2]:
        q = _tc_qdiscs(lab, h)
        assert "qdisc htb 7e57: dev data0 root" in q and "qdisc ingress ffff: dev data0" in q
        assert "qdisc htb 7e57: dev ifb-data0 root" in q
        assert not [ln for ln in q.splitlines() if "dev mgmt0" in ln and ("7e57" in ln or "ingress" in ln)]
    achieved = _iperf(lab, lab.hosts[0], lab.hosts[1])
    ideal = ideal_goodput_bps(rate)
    assert 0.5 * ideal <= achieved <= 1.05 * rate, f"achieved {achieved / 1e6:.1f} Mbit/s vs ideal {ideal / 1e6:.1f}"

    again = _playbook(lab, "shape.yml", "-e", "rate=50mbit")  # idempotent: nothing changes the second time
    assert again.returncode == 0, again.stdout[-3000:]
    assert "changed=0" in again.stdout, again.stdout[-2000:]

    down = _playbook(lab, "teardown.yml")
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-2000:]
    for h in lab.hosts:
        q = _tc_qdiscs(lab, h)
        assert "7e57" not in q and "ingress" not in q, q
        assert "ifb-data0" not in lab.netns_exec(h, "ip", "link").stdout


def test_lab_check_status_and_shaping_roundtrip(lab, cluster):
    facts = cluster.check(rate_bps=200_000_000)
    assert set(facts) == {"h0", "h1", "h2"}
    assert facts["h0"]["nic_speed_mbps"] == 10000 and facts["h0"]["gpus"] == 0
    assert [h.address for h in cluster.hosts()] == [h.data_addr for h in lab.hosts]

    applied = cluster.apply_shaping(LinkShape(rate_bps=100_000_000))
    assert [r["host"] for r in applied] == ["h0", "h1", "h2"] and all(r["changed"] for r in applied)
    st = cluster.status()
    assert st["backend"] == "lab"
    for row in st["hosts"]:
        assert row["links"]["upload"]["rate_bps"] == 100_000_000 and row["links"]["upload"]["owned"]
        assert row["links"]["download"]["rate_bps"] == 100_000_000
        assert row["links"]["download"]["ifname"] == "ifb-data0"
    # confirmed: no pending record, no timer left to undo it
    assert all(cluster.shaping(h)["pending"] is None for h in ("h0", "h1", "h2"))
    assert not cluster.apply_shaping(LinkShape(rate_bps=100_000_000))[0]["changed"]
    cluster.clear_shaping()
    for h in lab.hosts:
        assert "7e57" not in _tc_qdiscs(lab, h)


def test_check_fails_clearly(lab):
    from testbed.cluster.lab.cluster import LabCluster

    with pytest.raises(InputError, match=r"host h0: data0 links at 10gbit, slower than the requested 20gbit"):
        LabCluster.from_inventory(lab.write_inventory("i1.yml")).check(rate_bps=20_000_000_000)
    with pytest.raises(ClusterError, match=r"testbed_gpus_per_host is 2 but nvidia-smi shows 0 GPUs"):
        LabCluster.from_inventory(lab.write_inventory("i2.yml", testbed_gpus_per_host=2)).check()
    assert LabCluster.from_inventory(lab.write_inventory("i3.yml", testbed_gpus_per_host=2), allow_cpu=True).check()
    with pytest.raises(ClusterError, match=r"no data interface 'eth9' \(testbed_data_iface\); the host has: data0"):
        LabCluster.from_inventory(lab.write_inventory("i4.yml", testbed_data_iface="eth9")).check()
    with pytest.raises(ClusterError, match=r"cannot reach root@.*:2222.*(refused|Unable to connect)"):
        LabCluster.from_inventory(lab.write_inventory("i5.yml", ansible_port=2222)).check()


def test_wrong_key_and_unknown_host_key_refused(lab):
    from testbed.cluster.lab.cluster import LabCluster

    other = lab.tmp / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(ClusterError, match="authentication failed for root@"):
        LabCluster.from_inventory(lab.write_inventory("wrongkey.yml", ansible_ssh_private_key_file=str(other))).check()

    empty = lab.tmp / "known_hosts_empty"
    empty.write_text("")
    path = lab.write_inventory("unknown.yml", ansible_ssh_common_args=f"-o UserKnownHostsFile={empty}")
    with pytest.raises(ClusterError, match=r"host key .* is not in .*known_hosts_empty.*--accept-new-host-keys"):
        LabCluster.from_inventory(path).check()
    assert empty.read_text() == ""  # nothing recorded without the opt-in
    # explicit opt-in: trust on first use records the key, which then verifies on the next connection
    LabCluster.from_inventory(path, accept_new_host_keys=True).hosts()[0]
    assert LabCluster.from_inventory(path, accept_new_host_keys=True).run("h0", ["true"]).returncode == 0
    assert lab.hosts[0].mgmt_addr in empty.read_text()
    assert LabCluster.from_inventory(path).run("h0", ["true"]).returncode == 0

    # a changed key is refused even with the opt-in
    forged = lab.tmp / "known_hosts_forged"
    forged.write_text(
        f"{lab.hosts[0].mgmt_addr} {open(f'{other}.pub').read().split()[0]} {open(f'{other}.pub').read().split()[1]}\n"
    )
    bad = lab.write_inventory("forged.yml", ansible_ssh_common_args=f"-o UserKnownHostsFile={forged}")
    with pytest.raises(ClusterError, match="host key CHANGED"):
        LabCluster.from_inventory(bad, accept_new_host_keys=True).run("h0", ["true"])


def test_shell_metacharacters_in_inventory_are_literal(lab, tmp_path):
    from testbed.cluster.lab.cluster import LabCluster

    marker = tmp_path / "pwned"
    evil_iface = f"data0;touch {marker}"
    evil_dir = f"{REPO}$(touch {marker})"
    c = LabCluster.from_inventory(lab.write_inventory("evil1.yml", testbed_data_iface=evil_iface))
    with pytest.raises(ClusterError, match=r"no data interface 'data0;touch"):
        c.check()
    with pytest.raises((ShapingError, InputError)):
        c.apply_shaping(LinkShape(rate_bps=100_000_000))
    c2 = LabCluster.from_inventory(lab.write_inventory("evil2.yml", testbed_project_dir=evil_dir))
    with pytest.raises(ClusterError):
        c2.check()
    r = c2.run("h0", ["echo", f"`touch {marker}`", f"; touch {marker}", f"' && touch {marker} '"])
    assert r.returncode != 0  # cd into the literal (nonexistent) directory fails; nothing else ran
    res = LabCluster.from_inventory(lab.write_inventory("ok.yml")).run("h0", ["echo", f"$(touch {marker})"])
    assert res.stdout.strip() == f"$(touch {marker})"
    assert not marker.exists()
    assert "7e57" not in _tc_qdiscs(lab, lab.hosts[0])


def _ssh(lab, h, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The controller's OpenSSH client, as a user would log in (SSH_CONNECTION is set on the host)."""
    import shlex

    return subprocess.run(
        [
            "ssh",
            "-i",
            str(lab.client_key),
            "-o",
            f"UserKnownHostsFile={lab.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"root@{h.mgmt_addr}",
            f"cd {shlex.quote(str(REPO))} && " + " ".join(shlex.quote(a) for a in argv),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_management_interface_refused(lab):
    h = lab.hosts[2]
    res = _ssh(lab, h, PYTHON, "-m", "shaping", "apply", "--dev", "mgmt0", "--bw", "10mbit")
    assert res.returncode == 2, res.stderr
    assert "refusing to shape mgmt0: it carries the management connection" in res.stderr
    assert lab.controller_addr in res.stderr
    assert "7e57" not in _tc_qdiscs(lab, h)
    ok = _ssh(lab, h, PYTHON, "-m", "shaping", "apply", "--dev", "data0", "--bw", "10mbit")  # the data NIC is fine
    assert ok.returncode == 0, ok.stderr
    assert _ssh(lab, h, PYTHON, "-m", "shaping", "clear", "--dev", "data0").returncode == 0


def test_dead_man_timer_restores_when_controller_disappears(lab):
    """Arm a 2 s timer over SSH, vanish (kill the controller's ssh client), the host restores the previous shaping."""
    h = lab.hosts[1]
    base = _ssh(lab, h, PYTHON, "-m", "shaping", "apply", "--dev", "data0", "--bw", "300mbit")
    assert base.returncode == 0, base.stderr
    controller = subprocess.Popen(
        [
            "ssh",
            "-i",
            str(lab.client_key),
            "-o",
            f"UserKnownHostsFile={lab.known_hosts}",
            "-o",
            "BatchMode=yes",
            f"root@{h.mgmt_addr}",
            f"cd {REPO} && {PYTHON} -m shaping apply --dev data0 --bw 20mbit --ingress --confirm-within 2 && sleep 600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert controller.stdout.readline().startswith("data0: shaped egress+ingress at 20mbit")
        assert "rate 20Mbit" in lab.netns_exec(h, "tc", "class", "show", "dev", "data0").stdout
    finally:
        os.killpg(controller.pid, 9)  # the controller disappears without confirming
        controller.wait(timeout=10)
    t0 = time.monotonic()
    wait_for(
        lambda: "rate 300Mbit" in lab.netns_exec(h, "tc", "class", "show", "dev", "data0").stdout,
        20,
        "the timer to restore 300mbit on data0",
    )
    # the timer restores egress first, then removes the ingress redirect (new in the change) and its ifb
    wait_for(lambda: "ifb-data0" not in lab.netns_exec(h, "ip", "link").stdout, 20, "the timer to remove ifb-data0")
    assert time.monotonic() - t0 < 15
    late = _ssh(lab, h, PYTHON, "-m", "shaping", "confirm", "--dev", "data0")
    assert late.returncode == 1 and "too late" in late.stderr
    assert _ssh(lab, h, PYTHON, "-m", "shaping", "clear", "--dev", "data0").returncode == 0


def test_start_and_kill_group_two_hosts(lab, cluster, tmp_path):
    procs = []
    for name in ("h0", "h1"):
        procs.append(
            cluster.start(
                name,
                ["sh", "-c", "sleep 300 & sleep 300 & echo started $RANKX; wait"],
                env={"RANKX": name},
                log_path=tmp_path / f"{name}.log",
            )
        )
    for p in procs:
        assert p.poll() is None
        wait_for(lambda p=p: len(_group_members(lab, p.pgid)) >= 3, 10, "the group's children to start")
    for p in procs:
        p.kill_group()
        assert p.poll() is not None and p.poll() < 0
        assert _group_members(lab, p.pgid) == []
        assert "started h" in p.log_path.read_text()
    done = cluster.start(
        "h2", ["python", "-c", "import sys; print('hi'); sys.exit(3)"], env={}, log_path=tmp_path / "h2.log"
    )
    assert done.wait(timeout_s=30) == 3
    assert (tmp_path / "h2.log").read_text().strip() == "hi"


def _group_members(lab, pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout
    return [int(a) for a, b in (ln.split() for ln in out.splitlines()) if int(b) == pgid]


def test_down_kills_groups_started_by_another_controller(lab, tmp_path):
    from testbed.cluster.lab.cluster import LabCluster

    inv = lab.write_inventory("down.yml")
    first = LabCluster.from_inventory(inv)
    p = first.start("h1", ["sleep", "300"], env={}, log_path=tmp_path / "s.log")
    first.apply_shaping(LinkShape(rate_bps=50_000_000), hosts=[first.host("h1")])
    first.close()  # this controller goes away; a new one (testbed down) must still end the rank and clear shaping
    LabCluster.from_inventory(inv).down()
    wait_for(lambda: not _group_members(lab, p.pgid), 10, "the rank group to end")
    assert "7e57" not in _tc_qdiscs(lab, lab.hosts[1])


# Training through the lab backend (2 gloo ranks of `runners.train --model mlp` on 2 lab hosts over data0, started by
# LabCluster.start) is the `run` of test_cli_up_status_down_with_inventory: a separate direct one cost 2 torch ranks.


def test_cli_up_status_down_with_inventory(lab, tmp_path):
    """`testbed up --inventory` (no provision, --verify: iperf3 h0->h1 over the data NICs), `status --json`, `exec`,
    `run` (launcher over SSH), `down`."""
    # a secret in the controller's environment must never reach a host's command line or a rank
    env = {**os.environ, "TESTBED_STATE_DIR": str(tmp_path / "state"), "TB_TEST_SECRET_TOKEN": "s3cret-lab"}
    name = f"tbl{lab.suffix}"
    inv = lab.write_inventory("cli.yml")

    def cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "testbed.cli", *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
        )

    # --tolerance 0.5: the probe must show the limiter and no unit error; how close it comes is not a test's to ask
    up = cli("up", "--name", name, "--inventory", str(inv), "--no-provision", "--bw", "100mbit", "--verify",
             "--tolerance", "0.5")  # fmt: skip
    assert up.returncode == 0, up.stderr + up.stdout
    assert "verified: h0->h1" in up.stdout and "of ideal goodput" in up.stdout, up.stdout
    st = cli("status", "--name", name, "--json")
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["backend"] == "lab" and [h["name"] for h in data["hosts"]] == ["h0", "h1", "h2"]
    assert all(h["links"]["upload"]["rate_bps"] == 100_000_000 for h in data["hosts"])
    ex = cli("exec", "--name", name, "h1", "--", "cat", "/sys/class/net/data0/address")
    assert ex.returncode == 0 and ex.stdout.strip().count(":") == 5, ex.stderr
    if (REPO / "testbed" / "launch.py").exists() and (REPO / "runners" / "train.py").exists():
        run = cli(
            "run",
            "--name",
            name,
            "--model",
            "mlp",
            "--iters",
            "3",
            "--warmup-iters",
            "1",
            "--batch-size",
            "8",
            "--bw",
            "200mbit",
            "--world-size",
            "2",
            "--out",
            str(tmp_path / "results"),
            "--timeout",
            "200",
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert "200mbit / " in run.stdout  # requested / measured goodput of the trial's probe
        assert "2 ranks" in run.stdout  # 2 hosts x 1 rank: real gloo training over the data NICs
        rows = json.loads(cli("results", str(tmp_path / "results"), "--json").stdout)
        assert [(r["status"], r["host_count"], r["ranks_per_host"], r["world_size"]) for r in rows] == [("ok", 2, 1, 2)]
        # what reaches a rank over SSH: the allowlist and the named --env, never the controller's secret; 2 ranks per
        # lab host (stand-in ranks: no torch import for 4 ranks)
        dump = cli("run", "--name", name, "--bw", "none", "--no-probe", "--world-size", "4", "--ranks-per-host", "2",
                   "--out", str(tmp_path / "envs"), "--runner-module", "tests.integration.fault_runner", "--env",
                   "TESTBED_FAULT=dumpenv", "--env", "MY_SETTING=42", "--model", "mlp", "--iters", "1")  # fmt: skip
        assert dump.returncode == 0, dump.stdout[-2000:] + dump.stderr[-2000:]
        assert "4 ranks" in dump.stdout  # 2 hosts x 2 ranks
        rows = json.loads(cli("results", str(tmp_path / "envs"), "--json").stdout)
        assert [(r["host_count"], r["ranks_per_host"], r["world_size"]) for r in rows] == [(2, 2, 4)]
        seen = [json.loads(p.read_text()) for p in sorted((tmp_path / "envs").rglob("env-rank*.json"))]
        assert len(seen) == 4
        for e in seen:
            assert "TB_TEST_SECRET_TOKEN" not in e and "s3cret-lab" not in json.dumps(e)
            assert e["MY_SETTING"] == "42" and e["GLOO_SOCKET_IFNAME"] == "data0"
            assert e.get("TESTBED_STATE_DIR") is None  # nor the controller's own settings
        shown = json.loads(cli("status", "--name", name, "--json").stdout)
        assert all(h["links"]["upload"]["rate_bps"] == 100_000_000 for h in shown["hosts"])  # up's shape is back
    bad = cli("up", "--name", name + "x", "--inventory", str(inv), "--no-provision", "--bw", "20gbit")
    assert bad.returncode == 2 and "slower than the requested 20gbit" in bad.stderr
    assert bad.stderr.count("\n") == 1
    down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    for h in lab.hosts:
        assert "7e57" not in _tc_qdiscs(lab, h)
        # no commit-confirm timer or state left on the host (`down` clears with --forget)
        assert not Path(f"/run/testbed-shaping/netns-{lab.inodes[h.ns]}").exists()


def test_failed_host_rolls_back_the_others(lab):
    """h0 and h1 get shaped, h2 fails (no such NIC): h0 and h1 are restored to what they had, at once."""
    from testbed.cluster.lab.cluster import LabCluster

    inv = lab.inventory()
    inv["all"]["children"]["testbed"]["hosts"]["h2"]["testbed_data_iface"] = "nope0"
    c = LabCluster.from_inventory(lab.write_inventory("partial.yml", inventory=inv))
    c.apply_shaping(LinkShape(rate_bps=300_000_000), hosts=[c.host("h0")])  # h0 had 300mbit before
    with pytest.raises(InputError, match="host h2: no interface 'nope0'"):
        c.apply_shaping(LinkShape(rate_bps=50_000_000))
    assert "rate 300Mbit" in lab.netns_exec(lab.hosts[0], "tc", "class", "show", "dev", "data0").stdout
    assert "7e57" not in _tc_qdiscs(lab, lab.hosts[1])
    assert "rate 300Mbit" in lab.netns_exec(lab.hosts[0], "tc", "class", "show", "dev", "ifb-data0").stdout
    assert c.shaping("h0")["pending"] is None  # rolled back now, not left to the timer
    c.clear_shaping([c.host("h0"), c.host("h1")])
