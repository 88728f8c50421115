"""Two commands at once on one cluster (root): the cluster's lease serialises them.

Chosen behaviour (docs/quickstart.md, "Two commands at once"): a command that finds the cluster in use refuses at
once, naming the holder's pid and command, unless given `--wait SECONDS`, in which case it waits up to that long and
then runs. Ranks are the fault runner (tests/integration/fault_runner.py): `hang` blocks until the controller ends
it, `tcshow` writes the qdisc its host's link had while the trial ran.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ended_on_exit, one_line, wait_for
from test_signals import FAST, FAULT_RUNNER, link_rates, rank_pids, rows, start_run, stderr_of

pytestmark = pytest.mark.root


def test_shape_and_a_second_run_during_a_run_are_refused_naming_the_holder(
    make_cluster, cli_env, testbed_cli, tmp_path
):
    name = make_cluster(2, "--bw", "1gbit")
    out = tmp_path / "res"
    proc = start_run(cli_env, name, out, "--bw", "100mbit")
    with ended_on_exit(proc):
        wait_for(lambda: rank_pids(out), 60, "both ranks started")
        shaped = testbed_cli("shape", "--name", name, "--bw", "500mbit")
        assert shaped.returncode == 1
        line = one_line(shaped.stderr)
        assert f"in use by pid {proc.pid}" in line and "testbed run --name" in line and "--wait" in line, line
        assert link_rates(testbed_cli, name) == {100_000_000}  # the trial's rate, untouched
        second = testbed_cli("run", "--name", name, "--bw", "200mbit", "--out", str(tmp_path / "other"), *FAST,
                             *FAULT_RUNNER)  # fmt: skip
        assert second.returncode == 1 and f"pid {proc.pid}" in one_line(second.stderr)
        assert not (tmp_path / "other" / "rows").is_dir() or rows(tmp_path / "other") == []
        down = testbed_cli("down", "--name", name)
        assert down.returncode == 1 and f"pid {proc.pid}" in one_line(down.stderr)
        forced = testbed_cli("down", "--name", name, "--force")  # a live holder is refused even with --force
        assert forced.returncode == 1 and "alive" in one_line(forced.stderr)
        status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)  # status reads freely
        assert status["in_use_by"]["pid"] == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM, stderr_of(proc)
    # the run's restore put the cluster's own 1gbit back: a refused shape never slipped in between
    assert link_rates(testbed_cli, name) == {1_000_000_000}
    assert testbed_cli("shape", "--name", name, "--bw", "500mbit").returncode == 0
    assert link_rates(testbed_cli, name) == {500_000_000}


def _sweep(env: dict[str, str], name: str, out: Path, rates: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "sweep", "--name", name, "--bw", rates, "--compressor", "syncsgd",
         "--world-size", "2", "--out", str(out), *FAST, *FAULT_RUNNER, "--env", "TESTBED_FAULT=tcshow",
         "--wait", "300"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_two_sweeps_on_one_cluster_wait_and_every_row_has_its_links_rate(make_cluster, cli_env, testbed_cli, tmp_path):
    """Two sweeps with --wait started together: one runs its grid, the other waits and then runs its own. Each rank
    recorded the qdisc of its link during the trial: it is the row's rate for every row of both sweeps."""
    name = make_cluster(2, "--bw", "1gbit")
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [_sweep(cli_env, name, outs[0], "100mbit,300mbit"), _sweep(cli_env, name, outs[1], "200mbit,400mbit")]
    with contextlib.ExitStack() as ended:
        for p in procs:
            ended.enter_context(ended_on_exit(p))
        results = [p.communicate(timeout=400) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    seen = []
    for out in outs:
        for row in rows(out):
            assert row["status"] == "ok", row["error"]
            trial_dir = out / "trials" / row["trial_id"]
            for rank in (0, 1):
                shown = (trial_dir / f"tc-rank{rank}.txt").read_text()
                assert _htb_rate_bps(shown) == row["rate_bps"], (shown, row["rate_bps"])
            seen.append(row["rate_bps"])
    assert sorted(seen) == [100_000_000, 200_000_000, 300_000_000, 400_000_000]
    assert link_rates(testbed_cli, name) == {1_000_000_000}


def _htb_rate_bps(tc_class_show: str) -> int:
    """The rate of the testbed's HTB class (handle 7e57:) in `tc class show` text, e.g. "rate 100Mbit"."""
    m = re.search(r"class htb 7e57:\S* .*?\brate (\d+(?:\.\d+)?)([KMG]?)bit", tc_class_show)
    assert m, tc_class_show
    return round(float(m[1]) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m[2]])


def test_same_out_from_two_processes_keeps_both_attempts(make_cluster, cli_env, testbed_cli, tmp_path):
    """The same trial with the same --out from two processes at once (the second waits for the cluster): two
    attempts, both rows stored, each with its own trial directory."""
    name = make_cluster(2)
    out = tmp_path / "res"
    args = ["run", "--name", name, "--bw", "100mbit", "--out", str(out), *FAST, *FAULT_RUNNER, "--env",
            "TESTBED_FAULT=ok", "--rerun", "--wait", "300"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "testbed.cli", *args],
            env=cli_env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    with contextlib.ExitStack() as ended:
        for p in procs:
            ended.enter_context(ended_on_exit(p))
        results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    stored = rows(out)
    assert sorted(r["attempt"] for r in stored) == [1, 2] and {r["status"] for r in stored} == {"ok"}
    trial_id = stored[0]["trial_id"]
    assert (out / "trials" / trial_id / "summary.json").is_file()
    assert (out / "trials" / f"{trial_id}.2" / "summary.json").is_file()
