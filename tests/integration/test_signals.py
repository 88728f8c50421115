"""Signals and faults of `testbed run` on real emulated hosts (root): SIGTERM, SIGHUP and SIGKILL of the controller,
a results directory that fills up or turns read-only mid-trial, `down --all` beside a foreign namespace.

Ranks are the fault runner (tests/integration/fault_runner.py): they print a marker line into their logs and then
block (or wait at a gate the test opens), so the tests signal only once both ranks run, never after a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    REPO,
    cluster_netns,
    ended_on_exit,
    module_cluster,
    one_line,
    pids_in_netns,
    random_suffix,
    run_cli,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.xdist_group("test_signals")]  # module-scoped cluster

FAST = ["--model", "mlp", "--batch-size", "8", "--iters", "3", "--warmup-iters", "2", "--no-probe"]
FAULT_RUNNER = ["--runner-module", "tests.integration.fault_runner"]


@pytest.fixture(scope="module")
def cluster(state_dir: Path):
    """One 2-host cluster shaped at 1gbit, shared by the tests that leave it as they found it (no processes left in
    its namespaces, its own shaping back); the tests that take a cluster down make their own."""
    with module_cluster(state_dir) as name:
        yield name


def start_run(env: dict[str, str], name: str, out: Path, *extra: str, fault: str = "hang") -> subprocess.Popen:
    """`testbed run` in the background with fault-runner ranks; its stderr goes to out.parent/'<pid>.err'."""
    err = open(out.parent / f"run-{random_suffix()}.err", "w+")  # noqa: SIM115 - read by the test after the run
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", "--name", name, "--out", str(out), *FAST, *FAULT_RUNNER,
         "--env", f"TESTBED_FAULT={fault}", "--timeout", "600", *extra],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
    )  # fmt: skip
    proc.err_file = err  # type: ignore[attr-defined]
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    proc.err_file.seek(0)  # type: ignore[attr-defined]
    return proc.err_file.read()  # type: ignore[attr-defined]


def rank_pids(out: Path, world_size: int = 2) -> list[int]:
    """The pids the fault runner's ranks printed in their logs, once all of them have started (else [])."""
    pids = []
    for log in sorted(out.glob("trials/*/logs/rank*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("fault runner rank"):
                pids.append(int(line.split(" pid ")[1].split()[0]))
    return pids if len(pids) >= world_size else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def link_rates(testbed_cli, name: str) -> set[int | None]:
    status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    return {h["links"][d].get("rate_bps") for h in status["hosts"] for d in ("upload", "download")}


def rows(out: Path) -> list[dict]:
    from testbed.results import ResultsStore

    return ResultsStore(out).read_rows()


def killed_run(env: dict[str, str], name: str, out: Path) -> tuple[subprocess.Popen, list[int]]:
    """A trial at 100 Mbit/s whose controller is SIGKILLed once both ranks run: (the controller, the ranks' pids)."""
    proc = start_run(env, name, out, "--bw", "100mbit")
    with ended_on_exit(proc):
        pids = wait_for(lambda: rank_pids(out), 240, "both ranks started")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_trial_like_ctrl_c(cluster, cli_env, testbed_cli, tmp_path, sig):
    """A closed SSH session (SIGHUP) or a CI cancel (SIGTERM): ranks ended, shaping restored, row interrupted."""
    name = cluster
    out = tmp_path / "res"
    proc = start_run(cli_env, name, out, "--bw", "100mbit")
    with ended_on_exit(proc):
        pids = wait_for(lambda: rank_pids(out), 240, "both ranks started")
        assert link_rates(testbed_cli, name) == {100_000_000}  # the trial's shaping is on
        proc.send_signal(sig)
        assert proc.wait(120) == 128 + sig, stderr_of(proc)
    assert not [p for p in pids if alive(p)], "ranks still running after the controller stopped"
    assert not any(pids_in_netns(ns) for ns in cluster_netns(name))
    assert link_rates(testbed_cli, name) == {1_000_000_000}  # the cluster's own shaping is back
    [row] = rows(out)
    assert row["status"] == "interrupted" and signal.Signals(sig).name in row["error"]
    assert row["rate_bps"] == 100_000_000


def test_sigkill_leftovers_are_ended_by_the_next_command(cluster, cli_env, testbed_cli, tmp_path):
    """SIGKILL cannot be handled: the next command that takes the cluster ends the ranks, restores the shaping,
    stores the killed trial's row as interrupted and says so in one line."""
    name = cluster
    out = tmp_path / "res"
    proc, pids = killed_run(cli_env, name, out)
    assert all(alive(p) for p in pids)  # a SIGKILLed controller leaves its ranks (they are in their own session)...
    assert link_rates(testbed_cli, name) == {100_000_000}  # ...and its shaping; `status` only reads
    assert rows(out) == []
    status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    assert status["unfinished_trial"] == {"pid": proc.pid, "what": status["unfinished_trial"]["what"], "processes": 2}
    # the next command on the cluster finds them first
    after = testbed_cli("shape", "--name", name, "--bw", "500mbit")
    assert after.returncode == 0, after.stderr
    line = one_line(after.stderr)
    assert f"pid {proc.pid}" in line and "was killed" in line and "ended 2 leftover processes" in line, line
    assert not [p for p in pids if alive(p)]
    assert not any(pids_in_netns(ns) for ns in cluster_netns(name))
    assert link_rates(testbed_cli, name) == {500_000_000}
    [row] = rows(out)
    assert row["status"] == "interrupted" and row["rate_bps"] == 100_000_000 and row["attempt"] == 1
    # nothing is left to finish: the command after that says nothing about it
    again = testbed_cli("shape", "--name", name, "--bw", "1gbit")
    assert again.returncode == 0 and again.stderr.strip() == ""
    assert len(rows(out)) == 1


def test_sigkill_then_down_ends_the_leftovers_and_keeps_the_row(make_cluster, cli_env, testbed_cli, tmp_path):
    name = make_cluster(2)
    out = tmp_path / "res"
    proc, pids = killed_run(cli_env, name, out)
    done = testbed_cli("down", "--name", name)
    assert done.returncode == 0, done.stderr
    assert "was killed" in done.stderr
    assert not [p for p in pids if alive(p)] and cluster_netns(name) == []
    assert [r["status"] for r in rows(out)] == ["interrupted"]


@contextlib.contextmanager
def mounted(what: list[str], where: Path):
    subprocess.run(["mount", *what, str(where)], check=True, capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_full_or_read_only_results_directory_keeps_the_row(cluster, cli_env, testbed_cli, tmp_path, fault):
    """The row cannot be stored at the end of an ok trial: one line, exit 1, the row kept beside the trial's records,
    and the command the line prints stores it once the directory is writable again."""
    name = cluster
    out = tmp_path / "res"
    (out / "rows").mkdir(parents=True)
    gate = tmp_path / "gate"
    with contextlib.ExitStack() as stack:
        if fault == "full":  # rows/ on a tiny file system of its own, filled while the trial runs
            stack.enter_context(mounted(["-t", "tmpfs", "-o", "size=64k", "tmpfs"], out / "rows"))
        else:  # rows/ bind-mounted onto itself, made read-only while the trial runs
            stack.enter_context(mounted(["--bind", str(out / "rows")], out / "rows"))
        proc = start_run(cli_env, name, out, "--bw", "100mbit", fault=f"gate:{gate}")
        with ended_on_exit(proc):
            wait_for(lambda: rank_pids(out), 240, "both ranks started")
            if fault == "full":
                fd = os.open(out / "rows" / ".filler", os.O_WRONLY | os.O_CREAT)
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * 4096):
                        pass
                os.close(fd)
            else:
                subprocess.run(["mount", "-o", "remount,bind,ro", str(out / "rows")], check=True)
            gate.touch()
            assert proc.wait(240) == 1
        line = one_line(stderr_of(proc))
        reason = "No space left on device" if fault == "full" else "Read-only file system"
        assert reason in line and "--store-pending" in line, line
        if fault == "full":
            (out / "rows" / ".filler").unlink()
        else:
            subprocess.run(["mount", "-o", "remount,bind,rw", str(out / "rows")], check=True)
        [kept] = out.glob("trials/*/row.pending.json")
        assert (kept.parent / "summary.json").is_file()  # the trial's measurements stayed in its directory
        command = line.split("`")[1].split()  # testbed results DIR --store-pending
        assert command[:2] == ["testbed", "results"]
        stored = run_cli(cli_env, *command[1:])
        assert stored.returncode == 0, stored.stderr
        [row] = rows(out)
        assert row["status"] == "ok" and row["iter_time_s_mean"] == 1.0 and row["rate_bps"] == 100_000_000
        assert not kept.exists()
    assert not any(pids_in_netns(ns) for ns in cluster_netns(name))


def test_down_all_keeps_a_foreign_namespace_named_like_ours(tmp_path, cli_env):
    """`down --all` removes what the testbed marked as its own and nothing else. Run in a private mount namespace
    with its own /run/netns, so the other clusters on this machine (other test sessions) are out of its sight."""
    name, foreign = "t" + random_suffix(), f"tb-{random_suffix()}-vpn"
    script = f"""
mount --make-rprivate / && mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns || exit 99
ip netns add {foreign}
{sys.executable} -m testbed.cli up --name {name} --hosts 2 >/dev/null || echo "up failed"
ip netns add tb-{name}-vpn
{sys.executable} -m testbed.cli down --all; echo "down exit $?"
ip netns list | awk '{{print "left " $1}}'
for ns in $(ip netns list | awk '{{print $1}}'); do ip netns delete "$ns"; done
"""
    env = {**cli_env, "TESTBED_STATE_DIR": str(tmp_path / "state")}  # no other test's clusters in sight either
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert "down exit 0" in done.stdout, done.stdout + done.stderr
    left = sorted(w.split()[1] for w in done.stdout.splitlines() if w.startswith("left "))
    assert left == sorted([foreign, f"tb-{name}-vpn"]), done.stdout  # foreign kept, even with our cluster's prefix
    assert f"cluster {name}: removed 3 namespaces" in done.stdout


@pytest.mark.parametrize("hosts", [",,", "h0,,h1", " "])
def test_shape_with_empty_host_names_is_refused(cluster, testbed_cli, hosts):
    name = cluster
    done = testbed_cli("shape", "--name", name, "--bw", "200mbit", "--hosts", hosts)
    assert done.returncode == 2
    assert "--hosts" in one_line(done.stderr)
    assert link_rates(testbed_cli, name) == {1_000_000_000}  # nothing changed


def test_a_failing_kill_skips_neither_the_other_kills_nor_the_restore(cluster, testbed_cli, tmp_path):
    """One process whose kill fails (an SSH connection down, an squeue error: a stand-in here, since a host cannot be
    made unreachable mid-call on this machine) must not keep the next process from being ended nor the shaping from
    being put back; the failure is reported."""
    from shaping.plan import LinkShape
    from testbed.cluster import backends
    from testbed.cluster.base import RankProcess
    from testbed.errors import ClusterError
    from testbed.launch import end_trial

    name = cluster
    opened = backends.open_cluster(name)
    hosts = opened.hosts()
    configured = opened.recorded_shape()
    opened.apply_shaping(LinkShape.from_dict({"rate_bps": 100_000_000}), hosts)  # the trial's rate

    class Unreachable(RankProcess):
        host = hosts[0]

        def poll(self):
            return None

        def kill_group(self):
            raise ClusterError("host h0: ssh: connection refused")

    real = opened.start(hosts[1], ["sleep", "600"], env={}, log_path=tmp_path / "sleep.log")
    problems = end_trial(opened, [Unreachable(), real], configured, hosts, lambda _m: None)
    assert len(problems) == 1 and "connection refused" in problems[0]
    assert real.poll() is not None and not alive(real.pid)
    assert link_rates(testbed_cli, name) == {1_000_000_000}


def test_up_refuses_a_name_whose_namespace_is_someone_elses(testbed_cli, cluster_name):
    """A foreign namespace with the name `up` would make (no testbed mark): refused (exit 2), the namespace kept."""
    foreign = f"tb-{cluster_name}-sw"
    subprocess.run(["ip", "netns", "add", foreign], check=True, capture_output=True)
    try:
        done = testbed_cli("up", "--name", cluster_name, "--hosts", "2")
        assert done.returncode == 2
        line = one_line(done.stderr)
        assert foreign in line and "not the testbed's" in line, line
        assert foreign in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert testbed_cli("down", "--name", cluster_name).returncode == 0  # down leaves it alone too
        assert foreign in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "delete", foreign], capture_output=True, check=False)
