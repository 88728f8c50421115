"""A local rank runs as root: nothing where the user stands may run with it.

`python -m runners.train` puts the current directory first on sys.path, so a `runners/` package or a `json.py` planted
in the directory a user starts `testbed run` from would run as root inside every rank. Local ranks run with `python -P`
(no current directory, no script folder on sys.path) in a working directory the controller made for the run. The
planted modules here write a marker file when imported; the trial must succeed and no marker may exist.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.root

PLANT = "import pathlib; pathlib.Path({marker!r}).write_text('imported {what} from the cwd')\n"


def _plant(cwd: Path, marker: Path) -> None:
    (cwd / "runners").mkdir()
    (cwd / "runners" / "__init__.py").write_text(PLANT.format(marker=str(marker), what="runners"))
    (cwd / "runners" / "train.py").write_text(PLANT.format(marker=str(marker), what="runners.train"))
    (cwd / "json.py").write_text(PLANT.format(marker=str(marker), what="json"))


def test_a_local_trial_started_from_a_planted_directory_imports_nothing_of_it(
    cli_env, make_cluster, tmp_path
):
    name = make_cluster(2)
    cwd, marker = tmp_path / "cwd", tmp_path / "MARKER"
    cwd.mkdir()
    _plant(cwd, marker)
    # the controller itself starts as the installed `testbed` command does: its own folder, not the cwd, on sys.path
    # (and no empty PYTHONPATH entry, which would mean the cwd too)
    env = {**cli_env, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "testbed.cli", "run", "--name", name, "--bw", "none", "--model", "mlp", "--batch-size", "8",
         "--iters", "2", "--warmup-iters", "1", "--no-probe", "--out", str(tmp_path / "res"), "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
    logs = sorted((tmp_path / "res").rglob("rank*.log"))
    assert len(logs) == 2  # the ranks really ran (and wrote their logs where the controller put them)


def test_the_clusters_start_runs_python_with_P_in_a_directory_of_its_own(state_dir, cluster_name, tmp_path,
                                                                         monkeypatch):  # fmt: skip
    from testbed.cluster.local import LocalCluster

    cluster, _ = LocalCluster.up(cluster_name, 1)
    cwd, marker = tmp_path / "cwd", tmp_path / "MARKER"
    cwd.mkdir()
    _plant(cwd, marker)
    monkeypatch.chdir(cwd)
    log = tmp_path / "logs" / "rank0.log"
    probe = "import json, os, sys, runners; print(json.dumps([os.getcwd(), sys.path, runners.__file__]))"
    p = cluster.start(cluster.hosts()[0], [sys.executable, "-c", probe], env={}, log_path=log)
    try:
        assert p.wait(60) == 0, log.read_text()
    finally:
        p.kill_group()
    import json

    where, path, runners_file = json.loads(log.read_text().strip().splitlines()[-1])
    assert not marker.exists(), marker.read_text()
    assert where == str(log.parent) and str(cwd) not in path and "" not in path
    assert Path(runners_file).resolve() == (REPO / "runners" / "__init__.py").resolve()
