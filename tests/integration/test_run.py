"""`testbed run` / `sweep` / `results` on real emulated hosts with real gloo ranks (root).

Every rank imports torch (~2-3 CPU-s), so trials are what this file costs: every built-in compressor is measured once,
in two sweeps whose stores the other assertions (resume, wire bytes, the stored-ok rule, results views) read. Tests
that leave the cluster as they found it share one module cluster (`cluster`); the ones that take it down or need GPUs
make their own. Small models and few iterations.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    REPO,
    cluster_netns,
    ended_on_exit,
    module_cluster,
    one_line,
    pids_in_netns,
    run_cli,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.xdist_group("test_run")]  # module-scoped cluster

FAST = ["--model", "mlp", "--batch-size", "8", "--iters", "3", "--warmup-iters", "2", "--no-probe"]
FAULT_RUNNER = ["--runner-module", "tests.integration.fault_runner"]


def _rows(out: Path) -> pd.DataFrame:
    from testbed.results import load_results

    return load_results(out)


@pytest.fixture(scope="module")
def cluster(state_dir: Path):
    """One 2-host cluster shaped at 1gbit for every test that leaves it as it found it (no ranks, its own shaping)."""
    with module_cluster(state_dir) as name:
        yield name


def _row_file(trial_id: str, attempt: int) -> str:
    return f"{trial_id}.parquet" if attempt == 1 else f"{trial_id}.{attempt}.parquet"


def _links(testbed_cli, name: str) -> set[int | None]:
    status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    return {h["links"][d]["rate_bps"] for h in status["hosts"] for d in ("upload", "download")}


def _interrupt_after_first_row(cli_env: dict[str, str], args: list[str], out: Path) -> None:
    """`testbed ARGS` (a sweep) in the background, Ctrl-C once its first trial is stored."""
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", *args], env=cli_env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    with ended_on_exit(proc):
        wait_for(lambda: len(list((out / "rows").glob("*.parquet"))) >= 1 if (out / "rows").is_dir() else False,
                 240, "the first stored trial")  # fmt: skip
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(120) != 0


SWEEP_A = ["syncsgd", "fp16", "powersgd"]  # the other built-ins are swept in test_the_other_compressors_...


def test_sweep_interrupted_then_resumed_and_a_stored_ok_trial_is_never_replaced(cluster, cli_env, testbed_cli,
                                                                                   tmp_path):
    """Half of the built-in compressors, swept at 500mbit on the 1gbit cluster: Ctrl-C after the first stored trial,
    then resumed: no row lost or duplicated, every attempt kept. Then, on that store: PowerSGD's wire bytes
    (interface counters) against Sync-SGD's, the stored-ok rule of `run` (refused without --rerun; a rerun that times
    out is attempt 2 beside the ok attempt 1, which `results` keeps showing) and `run`'s stored syncsgd baseline."""
    out = tmp_path / "sweep"
    args = ["sweep", "--name", cluster, "--bw", "500mbit", "--compressor", ",".join(SWEEP_A), "--rank", "1",
            "--world-size", "2", "--out", str(out), *FAST]  # fmt: skip
    _interrupt_after_first_row(cli_env, args, out)
    first = _rows(out)
    assert 1 <= (first["status"] == "ok").sum() < len(SWEEP_A)
    again = testbed_cli(*args, timeout_s=480)
    assert again.returncode == 0, again.stdout[-800:] + again.stderr[-800:]
    df = _rows(out)
    assert sorted(df["compressor"]) == sorted(SWEEP_A) and df["trial_id"].is_unique
    assert (df["status"] == "ok").all(), df[["compressor", "error"]].to_string()
    assert (df["iter_time_s_mean"] > 0).all() and (df["samples_per_s"] > 0).all()
    assert (df["rate_bps"] == 500_000_000).all()
    assert set(first.loc[first["status"] == "ok", "trial_id"]) <= set(df["trial_id"])
    assert _links(testbed_cli, cluster) == {1_000_000_000}  # the sweep shaped at 500mbit, then put 1gbit back
    # a finished sweep does nothing when run again
    third = testbed_cli(*args, timeout_s=120)
    assert "0 to run" in third.stdout

    # the compression is real on the link (interface counters), not only in the accounting: a ring all-reduce of 2
    # ranks sends the whole gradient (the mlp's 15k fp32: 61 kB), PowerSGD rank 1 a tenth of it (measured 0.11)
    sync, psgd = (df[df["compressor"] == c].iloc[0] for c in ("syncsgd", "powersgd"))
    assert sync["wire_tx_bytes_per_iter"] >= sync["payload_bytes_per_iter"] > 50_000
    assert psgd["payload_bytes_per_iter"] < 0.2 * sync["payload_bytes_per_iter"]
    assert psgd["wire_tx_bytes_per_iter"] < 0.2 * sync["wire_tx_bytes_per_iter"], (psgd, sync)

    # the same trial through `run`: stored ok, so refused without --rerun; a rerun that times out is stored beside it
    run = ["run", "--name", cluster, "--bw", "500mbit", "--compressor", "powersgd", "--rank", "1", "--out", str(out),
           *FAST, "--json"]  # fmt: skip
    refused = testbed_cli(*run)
    assert refused.returncode == 2 and "--rerun" in one_line(refused.stderr)
    late = testbed_cli(*run, "--rerun", "--timeout", "0.5", timeout_s=120)
    assert late.returncode == 1, late.stdout[-800:] + late.stderr[-800:]
    summary = json.loads(late.stdout)
    assert summary["row"]["status"] == "timeout" and summary["row"]["trial_id"] == psgd["trial_id"]
    assert summary["baseline_row"]["trial_id"] == sync["trial_id"]  # the summary compares with the stored syncsgd
    ok_n = int(psgd["attempt"])  # 1, or 2 when the Ctrl-C interrupted this trial's first attempt
    assert summary["row"]["attempt"] == ok_n + 1
    assert {_row_file(psgd["trial_id"], ok_n), _row_file(psgd["trial_id"], ok_n + 1)} <= {
        p.name for p in (out / "rows").glob("*.parquet")
    }
    ok_dir = psgd["trial_id"] if ok_n == 1 else f"{psgd['trial_id']}.{ok_n}"
    assert (out / "trials" / ok_dir / "summary.json").is_file()  # the ok attempt's records are untouched
    shown = [r for r in json.loads(testbed_cli("results", str(out), "--json").stdout)
             if r["trial_id"] == psgd["trial_id"]]  # fmt: skip
    assert [(r["attempt"], r["status"]) for r in shown] == [(ok_n, "ok")]
    assert shown[0]["iter_time_s_mean"] == pytest.approx(psgd["iter_time_s_mean"])
    every_psgd = sorted((r["attempt"], r["status"]) for r in
                        json.loads(testbed_cli("results", str(out), "--json", "--attempts").stdout)
                        if r["trial_id"] == psgd["trial_id"])  # fmt: skip
    assert every_psgd[-2:] == [(ok_n, "ok"), (ok_n + 1, "timeout")]

    # every attempt kept in its own row file (the interrupted one and the timed-out rerun too), none measured ok twice
    from testbed.results import load_results

    every = load_results(out, all_attempts=True)
    assert len(list((out / "rows").glob("*.parquet"))) == len(every)
    assert (every[every["status"] == "ok"].groupby("trial_id").size() == 1).all()
    assert set(every["trial_id"]) == set(df["trial_id"])


@pytest.mark.parametrize("half", [0, 1])
def test_the_other_compressors_on_two_hosts(cluster, testbed_cli, tmp_path, half):
    """With test_sweep_interrupted_then_resumed_...: every built-in compressor measured ok on two shaped hosts (the
    others in two halves, each test well inside the per-test timeout on a loaded machine)."""
    from runners.compressors import names

    rest = [c for c in names() if c not in SWEEP_A][half::2]
    assert len(rest) >= 2, names()
    out = tmp_path / "res"
    done = testbed_cli("sweep", "--name", cluster, "--bw", "500mbit", "--compressor", ",".join(rest), "--world-size",
                       "2", "--out", str(out), *FAST, timeout_s=480)  # fmt: skip
    assert done.returncode == 0, done.stdout[-800:] + done.stderr[-800:]
    df = _rows(out)
    assert sorted(df["compressor"]) == sorted(rest)
    assert (df["status"] == "ok").all(), df[["compressor", "error"]].to_string()
    assert (df["iter_time_s_mean"] > 0).all() and (df["samples_per_s"] > 0).all()
    assert (df["rate_bps"] == 500_000_000).all()
    assert _links(testbed_cli, cluster) == {1_000_000_000}  # the cluster's own shaping put back
    # results table and CSV export read the same store
    table = testbed_cli("results", str(out), "--json")
    assert table.returncode == 0 and len(json.loads(table.stdout)) == len(rest)
    csv = tmp_path / "all.csv"
    assert testbed_cli("results", str(out), "--csv", str(csv)).returncode == 0
    assert len(pd.read_csv(csv)) == len(rest)


def test_rank_crash_fails_fast_with_its_log(cluster, cli_env, tmp_path):
    name = cluster
    env = dict(cli_env, TESTBED_FAULT="hang")  # the controller's own variables never reach a rank: --env does
    # rank 0 blocks for ever: only ending the trial on rank 1's exit makes it "failed"; a launcher that waited for every
    # rank would hit --timeout instead (status "timeout"), well within this test's own time
    done = run_cli(
        env, "run", "--name", name, "--bw", "100mbit", "--out", str(tmp_path / "res"), *FAST, *FAULT_RUNNER, "--json",
        "--env", "TESTBED_FAULT=crash:1", "--timeout", "150", timeout_s=240,
    )  # fmt: skip
    assert done.returncode == 1
    row = json.loads(done.stdout)["row"]
    assert row["status"] == "failed"
    assert "rank 1" in row["error"] and "FAULT-MARKER" in row["error"]
    for ns in cluster_netns(name):
        assert pids_in_netns(ns) == [], f"rank processes left in {ns}"
    assert _rows(tmp_path / "res")["status"].tolist() == ["failed"]


def test_rank_hang_hits_the_trial_timeout(cluster, cli_env, tmp_path):
    name = cluster
    done = run_cli(
        cli_env,
        "run",
        "--env",
        "TESTBED_FAULT=hang",
        "--name",
        name,
        "--bw",
        "100mbit",
        "--out",
        str(tmp_path / "res"),
        "--timeout",
        "4",
        *FAST,
        *FAULT_RUNNER,
        "--json",
    )
    row = json.loads(done.stdout)["row"]
    assert row["status"] == "timeout" and "timed out" in row["error"]
    for ns in cluster_netns(name):
        assert pids_in_netns(ns) == []


def test_cli_killed_mid_run_is_cleaned_by_down(make_cluster, cli_env, testbed_cli, tmp_path):
    name = make_cluster(2)
    out = tmp_path / "res"
    env = cli_env
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            "--name",
            name,
            "--bw",
            "100mbit",
            "--out",
            str(out),
            *FAST,
            *FAULT_RUNNER,
            "--env",
            "TESTBED_FAULT=hang",
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with ended_on_exit(proc):
        wait_for(
            lambda: all(pids_in_netns(ns) for ns in cluster_netns(name) if ns.endswith(("-h0", "-h1"))),
            240,
            "ranks running in both host namespaces",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert any(pids_in_netns(ns) for ns in cluster_netns(name))  # the orphaned ranks are still there...
    done = testbed_cli("down", "--name", name)
    assert done.returncode == 0
    assert cluster_netns(name) == []  # ...and down removed them with everything else


# Bad `run` input (--world-size above the hosts, unknown compressor, --rank for topk, 9gbps, --batch-size 0) is refused
# with exit 2 and nothing started or written: tests/integration/test_bad_input.py (ON_CLUSTER, NO_CLUSTER; its snapshot
# covers the cluster's processes, qdiscs and the files).


def test_bad_sweep_input_exits_2(testbed_cli, tmp_path, cluster_name):
    bad = tmp_path / "bad.toml"
    bad.write_text('bw = ["100mbit"]\ncompressor = ["syncsgd"]\nworld_size = [2]\nbatchsize = 8\n')
    done = testbed_cli("sweep", "--name", cluster_name, "--config", str(bad))
    assert done.returncode == 2 and "bad.toml:4: unknown key 'batchsize'" in one_line(done.stderr)
    bad.write_text('bw = ["100mbit"]\ncompressor = ["syncsgd"]\nworld_size = 2\n')
    done = testbed_cli("sweep", "--name", cluster_name, "--config", str(bad))
    assert done.returncode == 2 and "world_size" in one_line(done.stderr)
    bad.write_text('bw = ["100mbit"\n')
    done = testbed_cli("sweep", "--name", cluster_name, "--config", str(bad))
    assert done.returncode == 2 and "invalid TOML" in one_line(done.stderr)
    # (`sweep --out FILE`: tests/integration/test_bad_input.py)
    assert cluster_netns(cluster_name) == []  # nothing was brought up


def test_shipped_sweeps_parse():
    from testbed.config import load_sweep_toml

    files = sorted((REPO / "sweeps").glob("*.toml"))
    assert files, "sweeps/ ships ready-made sweep files"
    for f in files:
        trials = load_sweep_toml(f)
        assert trials and len({t.trial_id for t in trials}) == len(trials)


# ---------------------------------------------------------------------------------------- several ranks per host
def test_two_hosts_two_ranks_each_count_only_inter_host_bytes(cluster, testbed_cli, tmp_path):
    """World size 4 as 2 hosts x 2 ranks (gloo): the row says so, and the shaped veth carries only the inter-host
    share of the ring (two ranks of a host talk over lo inside their namespace)."""
    name = cluster
    done = testbed_cli("run", "--name", name, "--bw", "1gbit", "--ranks-per-host", "2", "--model", "mlp",
                       "--batch-size", "8", "--iters", "4", "--warmup-iters", "1", "--out", str(tmp_path / "res"),
                       "--json", timeout_s=280)  # fmt: skip
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    row = json.loads(done.stdout)["row"]
    assert (row["host_count"], row["ranks_per_host"], row["world_size"], row["dist_backend"]) == (2, 2, 4, "gloo")
    # whether the trial was steady: its first two measured steps over its last two, each the slowest rank's
    records = [[json.loads(line)["iter_time_s"] for line in f.read_text().splitlines()]
               for f in sorted((tmp_path / "res" / "trials" / row["trial_id"]).glob("rank*.jsonl"))]  # fmt: skip
    steps = [max(ts) for ts in zip(*records, strict=True)]
    assert len(records) == 4 and len(steps) == 4
    assert row["settle_ratio"] == pytest.approx((steps[0] + steps[1]) / (steps[2] + steps[3]))
    d = row["payload_bytes_per_iter"]  # fp32 gradient bytes each rank all-reduces
    # ring all-reduce: every rank sends 2(n-1)/n d = 1.5 d to its right neighbour; of the four hops only 1->2 and
    # 3->0 leave a host, so a host's veth sends 1.5 d, while its two ranks together send 3 d.
    assert 1.3 * d < row["wire_tx_bytes_per_iter"] < 2.0 * d, (row["wire_tx_bytes_per_iter"], d)
    logs = sorted(p.name for p in (tmp_path / "res").rglob("rank*.log"))
    assert logs == ["rank0.log", "rank1.log", "rank2.log", "rank3.log"]


def test_only_allowlisted_and_named_variables_reach_the_ranks(cluster, cli_env, tmp_path):
    name = cluster
    env = dict(cli_env, TB_TEST_SECRET_TOKEN="s3cret-value", NCCL_DEBUG="WARN", CUDA_VISIBLE_DEVICES="5")
    done = run_cli(env, "run", "--name", name, "--bw", "100mbit", "--out", str(tmp_path / "res"), *FAST,
                   *FAULT_RUNNER, "--no-probe", "--json", "--env", "TESTBED_FAULT=dumpenv", "--env", "MY_SETTING=42")  # fmt: skip
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    dumps = sorted((tmp_path / "res").rglob("env-rank*.json"))
    assert len(dumps) == 2
    for path in dumps:
        seen = json.loads(path.read_text())
        assert "TB_TEST_SECRET_TOKEN" not in seen and "s3cret-value" not in json.dumps(seen)
        assert seen["MY_SETTING"] == "42" and seen["NCCL_DEBUG"] == "WARN"
        assert "CUDA_VISIBLE_DEVICES" not in seen  # the controller's never; CPU hosts get none
        assert seen["GLOO_SOCKET_IFNAME"] == "eth0" and seen["WORLD_SIZE"] == "2"
        assert seen["HOME"] == cli_env["HOME"]  # an emulated host is this machine: its loader variables go along
    row = json.loads(done.stdout)["row"]
    assert row["user_env_keys"] == "MY_SETTING,TESTBED_FAULT"  # names recorded, values never


def test_emulated_gpu_hosts_dry_run_plans_nccl_over_the_shaped_veths(cluster, cli_env, tmp_path, cluster_name):
    """No GPU here: a stand-in nvidia-smi lists 4 devices, so `up --gpus all` and the NCCL launch plan can be checked
    up to the point where ranks would start (`run --dry-run` starts nothing)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(cli_env, PATH=f"{fake}:{cli_env['PATH']}")
    up = run_cli(env, "up", "--name", cluster_name, "--hosts", "2", "--gpus", "all", "--json")
    assert up.returncode == 0, up.stderr
    assert [h["gpus"] for h in json.loads(up.stdout)["hosts"]] == [[0, 1], [2, 3]]
    dry = run_cli(env, "run", "--name", cluster_name, "--bw", "9gbit", "--compressor", "powersgd", "--dry-run",
                  "--env", "WANDB_API_KEY=abc")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["plan"]
    assert (plan["backend"], plan["hosts"], plan["ranks_per_host"], plan["world_size"]) == ("nccl", 2, 2, 4)
    envs = [r["env"] for r in plan["ranks"]]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "0,1", "2,3", "2,3"]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 2
    assert {e["NCCL_SOCKET_IFNAME"] for e in envs} == {"=eth0"} and {e["NCCL_NET"] for e in envs} == {"Socket"}
    assert {e["WANDB_API_KEY"] for e in envs} == {"***"} and "abc" not in dry.stdout
    # nothing was shaped or started by the dry run
    st = json.loads(run_cli(env, "status", "--name", cluster_name, "--json").stdout)
    assert all(h["links"]["upload"]["rate_bps"] is None for h in st["hosts"])
    # refusals, exit 2: more ranks per host than GPUs; nccl on a host without CUDA
    bad = run_cli(env, "run", "--name", cluster_name, "--bw", "1gbit", "--ranks-per-host", "3", "--world-size", "6",
                  "--backend", "nccl", "--dry-run")  # fmt: skip
    assert bad.returncode == 2 and "--ranks-per-host 3: host h0 has 2 GPU(s)" in bad.stderr
    bad = run_cli(cli_env, "run", "--name", cluster, "--bw", "1gbit", "--backend", "nccl", "--out",
                  str(tmp_path / "res"))  # fmt: skip
    assert bad.returncode == 2 and "--backend nccl: host h0 has no CUDA device" in bad.stderr
    assert not (tmp_path / "res").exists()
    nogpu = run_cli(cli_env, "up", "--name", cluster_name + "g", "--hosts", "2", "--gpus", "all")
    assert nogpu.returncode == 2 and "no CUDA device on this machine" in nogpu.stderr
