"""`make gpu-check` (bench/gpu_check.py) on a machine without CUDA: it says so and exits 0; and its whole path
(capabilities, namespaces, shaping, preflight, probe, launch plan, rank start, results table, then calibration,
co-located profile and the report's predictions) runs with gloo on the CPU, so the script a GPU machine runs is known
to work up to the NCCL part. Its first-contact behaviour is tested here too: a preflight rank that dies at init makes
it print both ranks' log tails and go on (over loopback) at once, and a short --deadline ends it cleanly with its
partial tables and the tarball under --out."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, cluster_netns

pytestmark = pytest.mark.root

CPU = ["--backend", "gloo", "--model", "mlp", "--batch-size", "8", "--iters", "2", "--warmup-iters", "1"]


def _check(cli_env, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu_check.py", *args], capture_output=True, text=True, cwd=REPO,
                          env=cli_env, timeout=timeout_s)  # fmt: skip


def _tar_names(out: Path) -> list[str]:
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        return tar.getnames()


def test_without_cuda_the_check_is_skipped_with_a_word(cli_env):
    done = _check(cli_env, timeout_s=120)
    assert done.returncode == 0 and done.stdout.strip() == "no CUDA device: skipped", done.stdout + done.stderr


@pytest.mark.timeout(600)  # a whole check in one process (trials, calibration, profile): > 300 s at 3x load
def test_the_check_runs_end_to_end_on_cpu_with_gloo(cli_env, cluster_name, tmp_path):
    out = tmp_path / "res"
    # one calibration rep, and 0.5 s of CNN compute per contention measurement (2 s by default: per rank, rep, size and
    # collective); what the fit makes of more is test_calibrate's and bench/'s, here the stage has to run and store
    done = _check(cli_env, *CPU, "--rates", "200mbit", "--name", cluster_name, "--out", str(out), "--timeline", "1",
                  "--calibrate-sizes", "64kb,256kb,1mb", "--calibrate-reps", "1", "--calibrate-probe-s", "0.5",
                  timeout_s=540)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    trials, model = done.stdout.split("## Performance model on this cluster")
    trials, timelines = trials.split("| rate | compressor | rank | iteration |")
    for capability in ("namespace", "veth", "HTB", "iperf3"):  # one line each, found by doing it
        assert re.search(rf"^\| {capability} \| yes \|", trials, re.M), capability
    assert re.search(r"^\| ip \| (yes|no) \| .*not needed", trials, re.M)
    assert re.search(r"^\| NCCL sockets \| no \| not tried \(backend gloo\); the gloo preflight: 1 MB all-reduce", trials,
                     re.M)  # fmt: skip
    rows = [line for line in trials.splitlines() if line.startswith("| 200mbit |")]
    assert [r.split("|")[2].strip() for r in rows] == ["syncsgd", "powersgd"]
    assert all("| ok |" in r for r in rows)
    # --timeline 1: each trial's kept iteration, per rank, split into lanes; PowerSGD's codec and wire are marked
    # (built-in sync SGD has no hook: its codec is 0 and its wire "-")
    lanes = {(r.split("|")[2].strip(), r.split("|")[3].strip()): [c.strip() for c in r.split("|")[5:11]]
             for r in timelines.splitlines() if r.startswith("| 200mbit |")}  # fmt: skip
    assert sorted(lanes) == [("powersgd", "0"), ("powersgd", "1"), ("syncsgd", "0"), ("syncsgd", "1")], timelines
    for (comp, _rank), (it_ms, compute_ms, codec_ms, _crit, wire_ms, exposed_ms) in lanes.items():
        assert 0 < float(compute_ms) <= float(it_ms)
        if comp == "powersgd":
            assert float(codec_ms) > 0 and float(wire_ms) > 0 and 0 <= float(exposed_ms) <= float(wire_ms)
        else:
            assert float(codec_ms) == 0 and wire_ms == "-"
    # the model on the same cluster: calibrated at the trials' rate and backend (stored beside the profile), the
    # profile measured as the trials' 2 ranks share this machine, and each trial's prediction with its error
    assert "- calibration at 200mbit (gloo): fitted: latency alpha" in model
    assert "profile: mlp, batch 8, cpu, 2 co-located rank(s)" in model
    assert re.search(r"^profile's codec, encode \+ decode ms over all buckets: powersgd \d+\.\d \+ \d+\.\d", model, re.M)
    errors = [line.split("|")[2].strip() for line in model.splitlines() if line.startswith("| 200mbit |")]
    assert sorted(errors) == ["powersgd[rank=4]", "syncsgd"]
    assert "| powersgd[rank=4] | n/a |" in model  # one rate: no measured crossover, said so
    # everything under --out: the tables as printed, and one tarball with the rows, logs, calibration and profile
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.md", "gpu-check.tar.gz"]
    assert (out / "gpu-check.md").read_text().strip() == done.stdout.strip()
    names = _tar_names(out)
    assert f"gpu-check/results/profiles/calibration-{cluster_name}-gloo-p2-200mbit.json" in names
    assert any(n.startswith("gpu-check/results/rows/") for n in names) and "gpu-check/gpu-check.log" in names
    assert cluster_netns(cluster_name) == [] and cluster_netns(cluster_name + "p") == []


@pytest.mark.timeout(600)  # a whole check in one process (trials, calibration, profile): > 300 s at 3x load
def test_a_preflight_rank_that_dies_at_init_shows_both_tails_and_the_check_goes_on(cli_env, cluster_name, tmp_path):
    out = tmp_path / "res"
    done = _check(cli_env, *CPU, "--rates", "200mbit", "--compressors", "syncsgd", "--no-model", "--name",
                  cluster_name, "--out", str(out), "--fail-preflight-rank", "1", timeout_s=540)  # fmt: skip
    text = done.stdout
    assert done.returncode == 1, text[-3000:] + done.stderr[-2000:]  # the namespaced preflight failed: said so
    assert "Traceback" not in done.stderr
    # both ranks' log tails, the dead one's last words among them
    assert "gloo preflight (namespaces): rank0.log (last 15 lines)" in text
    assert "gloo preflight (namespaces): rank1.log (last 15 lines)" in text
    assert "allreduce_rank 1: exiting 3 at init (--fail-at-init)" in text
    # failed at once (the first non-zero exit), well within the preflight's 90 s
    after = re.search(r"the preflight in namespaces failed: rank 1 on h1 exited with code 3: .* \(after ([\d.]+) s\)",
                      text)  # fmt: skip
    assert after and float(after.group(1)) < 90, text
    # then the retry over loopback, and the next stage (the trial) ran there
    assert re.search(r"^\| NCCL sockets \| no \| not tried \(backend gloo\); the gloo preflight: 1 MB all-reduce over "
                     r"loopback sockets", text, re.M)  # fmt: skip
    rows = [line for line in text.splitlines() if line.startswith("| unshaped (lo) |")]
    assert len(rows) == 1 and "| syncsgd | gloo | ok |" in rows[0], text
    assert "gpu-check/preflight-namespaces/logs/rank1.log" in _tar_names(out)
    assert cluster_netns(cluster_name) == []


@pytest.mark.timeout(600)  # a whole check in one process (trials, calibration, profile): > 300 s at 3x load
def test_a_short_deadline_stops_the_check_cleanly_with_partial_tables_and_the_tarball(cli_env, cluster_name,
                                                                                       tmp_path):  # fmt: skip
    out = tmp_path / "res"
    rates, compressors = ["200mbit", "500mbit", "1gbit"], ["syncsgd", "powersgd"]
    done = _check(cli_env, *CPU, "--rates", ",".join(rates), "--compressors", ",".join(compressors), "--name",
                  cluster_name, "--out", str(out), "--deadline", "60", "--calibrate-sizes", "64kb,256kb,1mb",
                  "--calibrate-reps", "1", timeout_s=540)  # fmt: skip
    text = done.stdout
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, text[-3000:] + done.stderr[-2000:]
    # every planned trial has exactly one row: measured, failed, or skipped at the deadline (none left out)
    for rate in rates:
        for comp in compressors:
            assert len(re.findall(rf"^\| {rate} \| {comp} \|", text, re.M)) == 1, (rate, comp)
    assert "skipped: deadline" in text  # 6 trials, 2 calibrations and a profile do not fit in 60 s here
    # the deadline holds: stages get what is left minus a reserve for the cleanup; the allowance above 60 s is for
    # the cleanup itself on a loaded machine, not for any stage
    elapsed = re.search(r"; (\d+) s of 60$", text.strip())
    assert elapsed and int(elapsed.group(1)) <= 75, text[-500:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.md", "gpu-check.tar.gz"]
    assert (out / "gpu-check.md").read_text().strip() == text.strip()
    names = _tar_names(out)
    assert "gpu-check/gpu-check.md" in names and "gpu-check/gpu-check.log" in names
    assert cluster_netns(cluster_name) == [] and cluster_netns(cluster_name + "p") == []


def test_bad_calibration_sizes_fail_before_anything_runs(cli_env, cluster_name):
    done = _check(cli_env, "--backend", "gloo", "--name", cluster_name, "--calibrate-sizes", "1mb", timeout_s=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--calibrate-sizes 1000000: give at least 2 distinct message sizes" in done.stderr
    assert "GPU check" not in done.stdout and cluster_netns(cluster_name) == []


def test_without_pyroute2_the_check_says_so_and_runs_over_loopback(cli_env, cluster_name, tmp_path):
    """A bare GPU machine without .gpu-wheels: pyroute2 is imported only when namespaces are tried."""
    shim = tmp_path / "shim"
    shim.mkdir()
    # a finder ahead of every path entry (.gpu-wheels/ included, which the check puts first on sys.path)
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        "class HidePyroute2:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pyroute2' or name.startswith('pyroute2.'):\n"
        "            raise ImportError('pyroute2 hidden by the test')\n"
        "sys.meta_path.insert(0, HidePyroute2())\n"
    )
    env = {**cli_env, "PYTHONPATH": f"{REPO}:{shim}"}
    done = subprocess.run([sys.executable, "bench/gpu_check.py", *CPU, "--rates", "200mbit", "--compressors",
                           "syncsgd", "--no-model", "--name", cluster_name, "--out", str(tmp_path / "res")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)  # fmt: skip
    text = done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert re.search(r"^\| namespace \| no \| pyroute2 not importable \(pyroute2 hidden by the test\)", text, re.M)
    assert re.search(r"^\| veth \| no \| not tried: no namespaces", text, re.M), text
    assert "loopback fallback (unshaped): namespaces or veth do not work here" in text
    rows = [line for line in text.splitlines() if line.startswith("| unshaped (lo) |")]
    assert len(rows) == 1 and "| syncsgd | gloo | ok |" in rows[0], text
    assert done.returncode == 0 and cluster_netns(cluster_name) == []
