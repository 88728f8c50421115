"""`make gpu-check` (bench/gpu_check.py) on a machine without CUDA: it says so and exits 0; and its whole path
(namespaces, shaping, probe, launch plan, rank start, results table, then calibration, co-located profile and the
report's predictions) run once with gloo on the CPU, so the script a GPU machine runs is known to work up to the NCCL
part."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, cluster_netns

pytestmark = pytest.mark.root


def test_without_cuda_the_check_is_skipped_with_a_word(cli_env):
    done = subprocess.run([sys.executable, "bench/gpu_check.py"], capture_output=True, text=True, cwd=REPO,
                          env=cli_env, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "no CUDA device: skipped", done.stdout + done.stderr


def test_the_check_runs_end_to_end_on_cpu_with_gloo(cli_env, cluster_name, tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--backend", "gloo", "--model", "mlp", "--batch-size", "8", "--iters",
         "2", "--warmup-iters", "1", "--rates", "200mbit", "--name", cluster_name, "--out", str(tmp_path / "res"),
         "--calibrate-sizes", "64kb,256kb,1mb", "--calibrate-reps", "2"],
        capture_output=True, text=True, cwd=REPO, env=cli_env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials, model = done.stdout.split("## Performance model on this cluster")
    assert "| netns + veth + HTB | yes" in trials
    rows = [line for line in trials.splitlines() if line.startswith("| 200mbit |")]
    assert [r.split("|")[2].strip() for r in rows] == ["syncsgd", "powersgd"]
    assert all("| ok |" in r for r in rows)
    # the model on the same cluster: calibrated at the trials' rate and backend (stored beside the profile), the
    # profile measured as the trials' 2 ranks share this machine, and each trial's prediction with its error
    assert "- calibration at 200mbit (gloo): fitted: latency alpha" in model
    assert (tmp_path / "res" / "profiles" / f"calibration-{cluster_name}-gloo-p2-200mbit.json").is_file()
    assert "profile: mlp, batch 8, cpu, 2 co-located rank(s)" in model
    errors = [line.split("|")[2].strip() for line in model.splitlines() if line.startswith("| 200mbit |")]
    assert sorted(errors) == ["powersgd[rank=4]", "syncsgd"]
    assert "| powersgd[rank=4] | n/a |" in model  # one rate: no measured crossover, said so
    assert cluster_netns(cluster_name) == [] and cluster_netns(cluster_name + "p") == []


def test_bad_calibration_sizes_fail_before_anything_runs(cli_env, cluster_name):
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--backend", "gloo", "--name", cluster_name, "--calibrate-sizes", "1mb"],
        capture_output=True, text=True, cwd=REPO, env=cli_env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--calibrate-sizes 1000000: give at least 2 distinct message sizes" in done.stderr
    assert "GPU check" not in done.stdout and cluster_netns(cluster_name) == []
