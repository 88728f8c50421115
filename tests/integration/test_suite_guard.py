"""The suite's own machinery, on real inner pytest runs:
- the leak guard (tests/conftest.py): a run that leaves a namespace of its making fails, naming it, and the namespace
  is removed; another session's namespaces are left alone (the guard once took a 3-worker run's live cluster, named
  like a test's, for the inner run's leak);
- xdist groups: `make test` runs `--dist loadgroup`, and a module marked `xdist_group` runs on one worker, so its
  module fixtures (a lab, a Slurm cluster, a rank job) are built once (with pytest 9 and xdist 3.8 every group was
  silently ignored and each of 3 workers built them again)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import CPU_LOG_ENV, NAMES_ENV, REPO, netns_list, random_suffix


def test_an_xdist_group_runs_on_one_worker_and_builds_its_module_fixture_once(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        "import os\n\nimport pytest\n\n"
        "pytestmark = pytest.mark.xdist_group('grouped')\n\n\n"
        "@pytest.fixture(scope='module')\n"
        "def built():\n"
        "    with open('setups.txt', 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n\n\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_uses_it(built, i):\n"
        "    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (CPU_LOG_ENV, NAMES_ENV)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_grouped.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout[-2000:]
    assert len((tmp_path / "setups.txt").read_text().split()) == 1  # one worker, one setup


@pytest.mark.root
def test_a_run_that_leaves_a_namespace_of_its_making_fails_and_it_is_removed_but_no_other(tmp_path):
    """The inner run draws its namespace's name (conftest.random_suffix) and leaves it; a namespace named like a
    test's but drawn by this (outer) run, standing for another session's cluster, is not the inner run's to remove."""
    other = f"tb-t{random_suffix()}-h0"
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\n\nfrom conftest import random_suffix\n\n\n"
        "def test_leaves_a_namespace():\n"
        "    ns = f'tb-t{random_suffix()}-h0'\n"
        "    open('leaked.txt', 'w').write(ns)\n"
        "    subprocess.run(['ip', 'netns', 'add', ns], check=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (CPU_LOG_ENV, NAMES_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    ns = None
    try:
        subprocess.run(["ip", "netns", "add", other], check=True)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "conftest",
             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_leaky.py")],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
        ns = (tmp_path / "leaked.txt").read_text()
        assert "1 passed" in done.stdout, done.stdout[-2000:]
        assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-2000:]
        assert "leak guard" in done.stdout and ns in done.stdout and other not in done.stdout
        assert ns not in netns_list() and other in netns_list()
    finally:
        for name in (ns, other):
            if name:
                subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
