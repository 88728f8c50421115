"""What a local rank really gets: the planned environment (the controller's loader and interpreter variables, never a
secret), in its host's network namespace, entered from Python (no `ip` binary on the rank's path)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.root


def _exec_done(cmdline: bytes) -> bool:
    return bool(cmdline) and b"netns_exec" not in cmdline


def _environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_a_local_rank_gets_the_loader_variables_and_no_secret_in_its_namespace(state_dir, cluster_name, tmp_path,
                                                                               monkeypatch):  # fmt: skip
    from testbed.cluster.local import LocalCluster
    from testbed.config import Trial
    from testbed.launch import make_plan
    from testbed.launch_plan import resolve

    cluster, _ = LocalCluster.up(cluster_name, 2)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/tbtest/lib")
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/tbtest/venv")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tbtest-secret-value")
    monkeypatch.setenv("PATH", "/usr/local/sbin/tbtest-no-ip-here")  # the controller's PATH: no `ip` in it
    trial = resolve(Trial("syncsgd", None, 2, runner="tests.integration.fault_runner"), cluster.hosts())
    plan = make_plan(cluster, trial, tmp_path / "out", timeout_s=60, user_env=(("TESTBED_FAULT", "hang"),))
    procs = []
    try:
        for r in plan.ranks:
            procs.append(cluster.start(r.host, [sys.executable, *r.argv], env=dict(r.env),
                                       log_path=tmp_path / "logs" / r.log_name))  # fmt: skip
        for p in procs:  # the namespace wrapper (netns_exec.py) has exec'd the rank (same pid): its argv is the rank's
            # (an empty read is not the rank yet: during execve /proc/PID/cmdline reads empty for a moment)
            wait_for(lambda p=p: _exec_done(open(f"/proc/{p.pid}/cmdline", "rb").read()), 30, "rank exec")
            assert b"fault_runner" in open(f"/proc/{p.pid}/cmdline", "rb").read()
            env = _environ(p.pid)
            assert env["LD_LIBRARY_PATH"] == "/opt/tbtest/lib" and env["VIRTUAL_ENV"] == "/opt/tbtest/venv"
            assert "AWS_SECRET_ACCESS_KEY" not in env and "tbtest-secret-value" not in str(env)
            assert env["PATH"] == "/usr/local/sbin/tbtest-no-ip-here"
            ns = os.stat(f"/run/netns/{p.host.netns}")
            mine = os.stat(f"/proc/{p.pid}/ns/net")
            assert (mine.st_dev, mine.st_ino) == (ns.st_dev, ns.st_ino), f"rank {p.pid} is not in {p.host.netns}"
        wait_for(lambda: all("fault runner rank" in (tmp_path / "logs" / r.log_name).read_text() for r in plan.ranks),
                 30, "both ranks ran")  # fmt: skip
    finally:
        for p in procs:
            p.kill_group()
