"""Signals of `testbed run` over the namespaced SSH lab (root; sshd in namespaces, tests/integration/labhosts.py).

Lab ranks are started with setsid on the hosts, so a controller that dies leaves them; SIGTERM must end them like
Ctrl-C, and after a SIGKILL the next command on the cluster ends them (their token checked) and stores the row.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ended_on_exit, wait_for
from labhosts import create_lab_hosts, pids_in_netns
from test_signals import rows

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server (/usr/sbin/sshd)"),
    pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3"),
    pytest.mark.xdist_group("test_lab_signals"),  # the module's lab and its cluster on one xdist worker
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hosts = create_lab_hosts(tmp_path_factory.mktemp("lab"), n_hosts=2)
    try:
        yield hosts
    finally:
        problems = hosts.teardown()
        assert not problems, problems


def fault_ranks(lab) -> list[int]:
    """Pids of fault-runner ranks running on the lab hosts (Python processes in the hosts' namespaces)."""
    found = []
    for h in lab.hosts:
        for pid in pids_in_netns(lab.inodes[h.ns]):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            argv = cmd.split(b"\0")
            if os.path.basename(argv[0]).startswith(b"python") and b"tests.integration.fault_runner" in argv:
                found.append(pid)  # the rank itself (not a wrapper shell of the remote start)
    return found


@pytest.fixture(scope="module")
def lab_cluster(lab, tmp_path_factory):
    """One `up` (and `down`) for both signals: each test ends with nothing running and up's shaping back."""
    env = {**os.environ, "TESTBED_STATE_DIR": str(tmp_path_factory.mktemp("sigstate") / "state"),
           "PYTHONPATH": str(REPO)}  # fmt: skip
    name = f"tbs{lab.suffix}"[:10]

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "testbed.cli", *argv], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=180)  # fmt: skip

    up = cli("up", "--name", name, "--inventory", str(lab.write_inventory("sig.yml")), "--no-provision", "--bw",
             "100mbit")  # fmt: skip
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        yield name, env, cli
    finally:
        down = cli("down", "--name", name)
        leftover = fault_ranks(lab)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        assert down.returncode == 0, down.stderr
        assert not leftover, f"fault-runner ranks left on the lab hosts: {leftover}"


def _start(env, name: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", "--name", name, "--bw", "50mbit", "--no-probe", "--world-size",
         "2", "--out", str(out), "--runner-module", "tests.integration.fault_runner", "--env", "TESTBED_FAULT=hang",
         "--model", "mlp", "--iters", "1", "--timeout", "600"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _shapes(cli, name: str) -> tuple[int, set[int]]:
    """The cluster's recorded shaping rate and the rates read back from the hosts' data NICs (one `status`)."""
    status = json.loads(cli("status", "--name", name, "--json").stdout)
    return status["shape"]["rate_bps"], {h["links"]["upload"]["rate_bps"] for h in status["hosts"]}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signal_of_a_lab_run_leaves_nothing_running_or_shaped(lab, lab_cluster, tmp_path, sig):
    name, env, cli = lab_cluster
    out = tmp_path / "res"
    proc = _start(env, name, out)
    with ended_on_exit(proc):
        ranks = wait_for(lambda: len(fault_ranks(lab)) >= 2 and fault_ranks(lab), 120, "both lab ranks running")
        assert _shapes(cli, name)[1] == {50_000_000}
        proc.send_signal(sig)
        proc.wait(120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + sig, proc.stderr.read()[-1500:]
    else:
        assert set(ranks) <= set(fault_ranks(lab))  # SIGKILL: the setsid'd ranks are still there...
        assert json.loads(cli("status", "--name", name, "--json").stdout)["shape"]["rate_bps"] == 100_000_000
        nxt = cli("shape", "--name", name, "--bw", "80mbit")  # ...until the next command on the cluster
        assert nxt.returncode == 0, nxt.stderr
        assert "was killed" in nxt.stderr and "ended 2 leftover processes" in nxt.stderr, nxt.stderr
        # `shape` on every lab host is the cluster's recorded shaping from now on, as on the emulated cluster
        assert _shapes(cli, name) == (80_000_000, {80_000_000})
        assert cli("shape", "--name", name, "--bw", "100mbit").returncode == 0
    assert fault_ranks(lab) == []
    assert _shapes(cli, name) == (100_000_000, {100_000_000})  # up's shaping is back
    [row] = rows(out)
    assert row["status"] == "interrupted" and row["rate_bps"] == 50_000_000
