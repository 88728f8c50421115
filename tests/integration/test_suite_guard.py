"""The suite's own leak guard (tests/conftest.py): a run that leaves a namespace of a test's making fails, naming it,
and the namespace is removed. Checked on a real inner pytest run that leaves one behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import CPU_LOG_ENV, REPO, netns_list, random_suffix

pytestmark = pytest.mark.root


def test_a_run_that_leaves_a_test_namespace_fails_and_the_namespace_is_removed(tmp_path):
    ns = f"tb-t{random_suffix()}-h0"
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\n\n\n"
        "def test_leaves_a_namespace():\n"
        f"    subprocess.run(['ip', 'netns', 'add', '{ns}'], check=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != CPU_LOG_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "conftest",
             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_leaky.py")],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
        assert "1 passed" in done.stdout, done.stdout[-2000:]
        assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout[-2000:]
        assert "leak guard" in done.stdout and ns in done.stdout
        assert ns not in netns_list()
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
