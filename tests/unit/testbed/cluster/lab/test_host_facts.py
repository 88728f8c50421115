"""shaping/files.py's atomic write, and the lab host-facts program that is sent to hosts as source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shaping.files import atomic_path, atomic_write
from testbed.cluster.lab import facts as lab
from testbed.cluster.lab import host_facts

REPO = Path(__file__).resolve().parents[5]


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "record.json"
    atomic_write(target, '{"a": 1}')
    atomic_write(target, b'{"a": 2}')
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_atomic_path_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "rows.parquet"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.parquet"]


def test_host_facts_source_is_what_lab_sends():
    assert lab.HOST_FACTS == Path(host_facts.__file__).read_text()
    compile(lab.HOST_FACTS, "host_facts", "exec")


def test_host_facts_reports_this_machine():
    done = subprocess.run(
        [sys.executable, "-c", lab.HOST_FACTS, "lo"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["python"] == list(sys.version_info[:3])
    assert facts["iface_exists"] is True and "lo" in facts["ifaces"]
    assert facts["torch"]  # read from package metadata, without importing torch
    missing = subprocess.run(
        [sys.executable, "-c", lab.HOST_FACTS, "../etc"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert json.loads(missing.stdout)["iface_exists"] is False  # a path is never a NIC name
