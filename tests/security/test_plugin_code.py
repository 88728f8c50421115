"""A plugin is code that runs as root in local mode: only the code the user named may run, and only when it must.

- `testbed check-compressor` starts `python -m runners.plugins describe` and `python -m runners.conformance`
  subprocesses as root. Started from a directory holding a `runners/` package and a `json.py` (another user's
  checkout, a shared scratch folder), those would run in place of the real modules. They run with `python -P` in a
  working directory of their own: the planted modules, which write a marker file when imported, never run.
- `testbed run --dry-run` prints the plan and the plugin's file and sha256 without importing the plugin (whose import
  writes a marker file).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.root

PLANT = "import pathlib; pathlib.Path({marker!r}).write_text('imported {what}')\n"


def _plant(cwd: Path, marker: Path) -> None:
    (cwd / "runners").mkdir(parents=True)
    for module in ("__init__", "plugins", "conformance", "catalog"):
        (cwd / "runners" / f"{module}.py").write_text(PLANT.format(marker=str(marker), what=f"runners.{module}"))
    (cwd / "json.py").write_text(PLANT.format(marker=str(marker), what="json"))


def test_check_compressor_imports_nothing_of_the_current_directory(cli_env, tmp_path):
    cwd, marker = tmp_path / "cwd", tmp_path / "MARKER"
    _plant(cwd, marker)
    # the controller starts as the installed `testbed` command does: its own folder on sys.path, not the cwd
    env = {**cli_env, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "testbed.cli", "check-compressor", "randk:make", "--plugin-path",
         str(REPO / "examples"), "--opt", "ratio=0.05", "--steps", "3", "--timeout", "120", "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert not marker.exists(), marker.read_text()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    outcome = json.loads(done.stdout)
    assert outcome["ok"] and outcome["plugin"]["module"] == "randk"  # the describe step ran, from the real runners
    assert {c["name"] for c in outcome["checks"]} >= {"order", "replicas", "payload"}


def test_dry_run_locates_the_plugin_without_importing_it(make_cluster, testbed_cli, tmp_path):
    plugin_dir, marker = tmp_path / "plug", tmp_path / "MARKER"
    plugin_dir.mkdir()
    source = (
        PLANT.format(marker=str(marker), what="the plugin") + "def make(process_group=None, **options):\n    pass\n"
    )
    (plugin_dir / "evilplug.py").write_text(source)
    name = make_cluster(1)
    done = testbed_cli("run", "--name", name, "--bw", "none", "--model", "mlp", "--compressor", "evilplug:make",
                       "--plugin-path", str(plugin_dir), "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()
    plugin = json.loads(done.stdout)["plugin"]
    assert plugin["imported"] is False and plugin["file"] == str(plugin_dir / "evilplug.py")
    assert plugin["sha256"] == hashlib.sha256(source.encode()).hexdigest()
    # the help says what a plugin is
    helped = testbed_cli("run", "--help")
    assert "code, run as root in local mode" in " ".join(helped.stdout.split())


def test_colocated_profile_ranks_import_nothing_of_the_current_directory(tmp_path, monkeypatch):
    """`testbed profile --colocated N` starts N `python -m runners.profile` processes as root: from a directory holding
    a planted `runners/` and `json.py`, the real modules run and the planted ones never do."""
    from testbed.modelling import measure_lockstep

    cwd, marker = tmp_path / "cwd", tmp_path / "MARKER"
    _plant(cwd, marker)
    (cwd / "runners" / "profile.py").write_text(PLANT.format(marker=str(marker), what="runners.profile"))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", "")  # what the installed command has: nothing of the cwd
    out = measure_lockstep(2, "mlp", 4, ["syncsgd"], None, image_size=None, seq_len=None, iters=1, bucket_cap_mb=25,
                           threads=1, device="cpu", timeout_s=240)  # fmt: skip
    assert not marker.exists(), marker.read_text()
    assert out["forward_s"] > 0  # measured by the real runners.profile
