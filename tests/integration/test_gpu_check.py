"""`make gpu-check` (bench/gpu_check.py) on a machine without CUDA: it says so and exits 0; and its whole path
(namespaces, shaping, probe, launch plan, rank start, results table) run once with gloo on the CPU, so the script a GPU
machine runs is known to work up to the NCCL part."""

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
         "2", "--warmup-iters", "1", "--rates", "200mbit", "--name", cluster_name, "--out", str(tmp_path / "res")],
        capture_output=True, text=True, cwd=REPO, env=cli_env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| netns + veth + HTB | yes" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 200mbit |")]
    assert [r.split("|")[2].strip() for r in rows] == ["syncsgd", "powersgd"]
    assert all("| ok |" in r for r in rows)
    assert cluster_netns(cluster_name) == [] and cluster_netns(cluster_name + "p") == []
