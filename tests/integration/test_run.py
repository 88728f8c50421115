"""`testbed run` / `sweep` / `results` on real emulated hosts with real gloo ranks (root).

Small models and few iterations keep this file to about two minutes on 2 cores.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, cluster_netns, one_line, pids_in_netns, run_cli, wait_for

pytestmark = pytest.mark.root

FAST = ["--model", "mlp", "--batch-size", "8", "--iters", "3", "--warmup-iters", "2", "--no-probe"]
FAULT_RUNNER = ["--runner-module", "tests.integration.fault_runner"]


def _rows(out: Path) -> pd.DataFrame:
    from testbed.results import load_results

    return load_results(out)


def test_run_every_compressor_on_two_hosts(make_cluster, testbed_cli, tmp_path):
    from runners.compressors import names

    name = make_cluster(2, "--bw", "1gbit")
    out = tmp_path / "res"
    for comp in names():
        done = testbed_cli(
            "run", "--name", name, "--bw", "500mbit", "--compressor", comp, "--out", str(out), *FAST, timeout_s=180
        )
        assert done.returncode == 0, f"{comp}: {done.stdout[-800:]} {done.stderr[-800:]}"
    df = _rows(out)
    assert sorted(df["compressor"]) == sorted(names())
    assert (df["status"] == "ok").all(), df[["compressor", "error"]].to_string()
    assert (df["iter_time_s_mean"] > 0).all() and (df["samples_per_s"] > 0).all()
    assert (df["rate_bps"] == 500_000_000).all()
    # the run shaped at 500mbit, then put the cluster's own 1gbit back
    status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    assert {h["links"]["upload"]["rate_bps"] for h in status["hosts"]} == {1_000_000_000}
    assert {h["links"]["download"]["rate_bps"] for h in status["hosts"]} == {1_000_000_000}
    # results table and CSV export read the same store
    table = testbed_cli("results", str(out), "--json")
    assert table.returncode == 0 and len(json.loads(table.stdout)) == len(names())
    csv = tmp_path / "all.csv"
    assert testbed_cli("results", str(out), "--csv", str(csv)).returncode == 0
    assert len(pd.read_csv(csv)) == len(names())


def test_powersgd_puts_far_fewer_bytes_on_the_wire(make_cluster, testbed_cli, tmp_path):
    """The compression is real on the link (interface counters), not only in the accounting."""
    name = make_cluster(2)
    out = tmp_path / "res"
    common = [
        "--model",
        "resnet18",
        "--image-size",
        "32",
        "--batch-size",
        "4",
        "--iters",
        "3",
        "--warmup-iters",
        "3",
        "--no-probe",
        "--out",
        str(out),
        "--name",
        name,
        "--bw",
        "none",
    ]
    sync = testbed_cli("run", "--compressor", "syncsgd", *common, "--json", timeout_s=300)
    psgd = testbed_cli("run", "--compressor", "powersgd", "--rank", "2", *common, "--json", timeout_s=300)
    assert sync.returncode == 0, sync.stderr[-1000:]
    assert psgd.returncode == 0, psgd.stderr[-1000:]
    sync_row, psgd_row = json.loads(sync.stdout)["row"], json.loads(psgd.stdout)["row"]
    assert sync_row["wire_tx_bytes_per_iter"] > 40e6  # resnet18: 11.7M fp32 gradients, all-reduced
    assert psgd_row["wire_tx_bytes_per_iter"] < 0.2 * sync_row["wire_tx_bytes_per_iter"]
    # the summary compares with the stored syncsgd baseline
    assert json.loads(psgd.stdout)["baseline_row"]["trial_id"] == sync_row["trial_id"]


def test_rank_crash_fails_fast_with_its_log(make_cluster, cli_env, tmp_path):
    name = make_cluster(2)
    env = dict(cli_env, TESTBED_FAULT="hang")  # the controller's own variables never reach a rank: --env does
    t0 = time.monotonic()
    done = run_cli(
        env, "run", "--name", name, "--bw", "100mbit", "--out", str(tmp_path / "res"), *FAST, *FAULT_RUNNER, "--json",
        "--env", "TESTBED_FAULT=crash:1",
    )  # fmt: skip
    assert time.monotonic() - t0 < 30
    assert done.returncode == 1
    row = json.loads(done.stdout)["row"]
    assert row["status"] == "failed"
    assert "rank 1" in row["error"] and "FAULT-MARKER" in row["error"]
    for ns in cluster_netns(name):
        assert pids_in_netns(ns) == [], f"rank processes left in {ns}"
    assert _rows(tmp_path / "res")["status"].tolist() == ["failed"]


def test_rank_hang_hits_the_trial_timeout(make_cluster, cli_env, tmp_path):
    name = make_cluster(2)
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
    try:
        wait_for(
            lambda: all(pids_in_netns(ns) for ns in cluster_netns(name) if ns.endswith(("-h0", "-h1"))),
            60,
            "ranks running in both host namespaces",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any(pids_in_netns(ns) for ns in cluster_netns(name))  # the orphaned ranks are still there...
    done = testbed_cli("down", "--name", name)
    assert done.returncode == 0
    assert cluster_netns(name) == []  # ...and down removed them with everything else


def test_sweep_interrupted_then_resumed_has_no_lost_or_duplicated_rows(make_cluster, cli_env, testbed_cli, tmp_path):
    name = make_cluster(2)
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--name",
        name,
        "--bw",
        "200mbit,1gbit",
        "--compressor",
        "syncsgd,fp16",
        "--world-size",
        "2",
        "--out",
        str(out),
        *FAST,
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", *args],
        env=cli_env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: len(list((out / "rows").glob("*.parquet"))) >= 1 if (out / "rows").is_dir() else False,
            120,
            "the first stored trial",
        )
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    first = _rows(out)
    assert 1 <= (first["status"] == "ok").sum() < 4
    again = testbed_cli(*args, timeout_s=300)
    assert again.returncode == 0, again.stderr[-800:]
    df = _rows(out)
    assert len(df) == 4 and df["trial_id"].is_unique and (df["status"] == "ok").all()
    ok_before = set(first.loc[first["status"] == "ok", "trial_id"])
    assert ok_before <= set(df["trial_id"])
    # a finished sweep does nothing when run again
    third = testbed_cli(*args, timeout_s=120)
    assert "0 to run" in third.stdout
    # every attempt kept in its own row file (the interrupted one too), and no trial measured ok twice
    from testbed.results import load_results

    every = load_results(out, all_attempts=True)
    assert len(list((out / "rows").glob("*.parquet"))) == len(every)
    assert (every[every["status"] == "ok"].groupby("trial_id").size() == 1).all()
    assert set(every["trial_id"]) == set(df["trial_id"])


@pytest.mark.parametrize(
    "args, expect",
    [
        (["run", "--bw", "100mbit", "--world-size", "5"], "needs 5 hosts; the cluster has 2"),
        (["run", "--bw", "100mbit", "--compressor", "zip"], "unknown compressor"),
        (["run", "--bw", "100mbit", "--compressor", "topk", "--rank", "4"], "does not apply to topk"),
        (["run", "--bw", "9gbps"], "ambiguous unit"),
        (["run", "--bw", "100mbit", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_bad_run_input_exits_2_and_starts_nothing(make_cluster, testbed_cli, tmp_path, args, expect):
    name = make_cluster(2)
    before = {ns: pids_in_netns(ns) for ns in cluster_netns(name)}
    done = testbed_cli(*args, "--name", name, "--out", str(tmp_path / "res"))
    assert done.returncode == 2
    assert expect in one_line(done.stderr)
    assert {ns: pids_in_netns(ns) for ns in cluster_netns(name)} == before
    assert not (tmp_path / "res" / "rows").exists()


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
    a_file = tmp_path / "file"
    a_file.write_text("x")
    done = testbed_cli(
        "sweep",
        "--name",
        cluster_name,
        "--bw",
        "1gbit",
        "--compressor",
        "syncsgd",
        "--world-size",
        "2",
        "--out",
        str(a_file),
    )
    assert done.returncode == 2 and "is a file" in one_line(done.stderr)
    assert cluster_netns(cluster_name) == []  # nothing was brought up


def test_shipped_sweeps_parse():
    from testbed.config import load_sweep_toml

    files = sorted((REPO / "sweeps").glob("*.toml"))
    assert files, "sweeps/ ships ready-made sweep files"
    for f in files:
        trials = load_sweep_toml(f)
        assert trials and len({t.trial_id for t in trials}) == len(trials)


def test_a_stored_ok_trial_is_never_replaced(make_cluster, testbed_cli, tmp_path):
    """Run twice: refused without --rerun; a rerun that times out is stored as attempt 2 beside the ok attempt 1,
    which `results` keeps showing."""
    name = make_cluster(2)
    out = tmp_path / "res"
    args = ["run", "--name", name, "--bw", "none", "--out", str(out), *FAST, "--json"]
    first = testbed_cli(*args, timeout_s=300)
    assert first.returncode == 0, first.stderr[-800:]
    ok_row = json.loads(first.stdout)["row"]
    assert ok_row["attempt"] == 1
    again = testbed_cli(*args)
    assert again.returncode == 2 and "--rerun" in one_line(again.stderr)
    late = testbed_cli(*args, "--rerun", "--timeout", "0.5", timeout_s=120)
    assert late.returncode == 1
    assert json.loads(late.stdout)["row"]["status"] == "timeout"
    assert sorted(p.name for p in (out / "rows").glob("*.parquet")) == [
        f"{ok_row['trial_id']}.2.parquet",
        f"{ok_row['trial_id']}.parquet",
    ]
    assert (out / "trials" / ok_row["trial_id"] / "summary.json").is_file()  # attempt 1's records are untouched
    shown = json.loads(testbed_cli("results", str(out), "--json").stdout)
    assert [(r["attempt"], r["status"]) for r in shown] == [(1, "ok")]
    assert shown[0]["iter_time_s_mean"] == pytest.approx(ok_row["iter_time_s_mean"])
    every = json.loads(testbed_cli("results", str(out), "--json", "--attempts").stdout)
    assert sorted((r["attempt"], r["status"]) for r in every) == [(1, "ok"), (2, "timeout")]


# ---------------------------------------------------------------------------------------- several ranks per host
def test_two_hosts_two_ranks_each_count_only_inter_host_bytes(make_cluster, testbed_cli, tmp_path):
    """World size 4 as 2 hosts x 2 ranks (gloo): the row says so, and the shaped veth carries only the inter-host
    share of the ring (two ranks of a host talk over lo inside their namespace)."""
    name = make_cluster(2)
    done = testbed_cli("run", "--name", name, "--bw", "1gbit", "--ranks-per-host", "2", "--model", "mlp",
                       "--batch-size", "8", "--iters", "4", "--warmup-iters", "1", "--out", str(tmp_path / "res"),
                       "--json", timeout_s=300)  # fmt: skip
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


def test_only_allowlisted_and_named_variables_reach_the_ranks(make_cluster, cli_env, tmp_path):
    name = make_cluster(2)
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


def test_emulated_gpu_hosts_dry_run_plans_nccl_over_the_shaped_veths(cli_env, testbed_cli, tmp_path, cluster_name):
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
    run_cli(env, "down", "--name", cluster_name)
    cpu = run_cli(cli_env, "up", "--name", cluster_name, "--hosts", "2")
    assert cpu.returncode == 0, cpu.stderr
    bad = run_cli(cli_env, "run", "--name", cluster_name, "--bw", "1gbit", "--backend", "nccl", "--out",
                  str(tmp_path / "res"))  # fmt: skip
    assert bad.returncode == 2 and "--backend nccl: host h0 has no CUDA device" in bad.stderr
    assert not (tmp_path / "res").exists()
    nogpu = run_cli(cli_env, "up", "--name", cluster_name + "g", "--hosts", "2", "--gpus", "all")
    assert nogpu.returncode == 2 and "no CUDA device on this machine" in nogpu.stderr
