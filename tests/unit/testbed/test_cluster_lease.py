"""The cluster lease (testbed.cluster.registry.lease) and the atomic attempt reservation, without namespaces.

Holders are real processes: a `python -c` child that takes the lease and keeps it until its stdin closes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO

from testbed.cluster import registry
from testbed.cluster.registry import ClusterBusy
from testbed.errors import ClusterError
from testbed.results import ResultsStore

HOLD = (
    "import sys; from testbed.cluster import registry\n"
    "with registry.lease(sys.argv[1], command='testbed sweep --name ' + sys.argv[1]):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)


@pytest.fixture
def private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def hold(name: str, env_state: Path) -> subprocess.Popen:
    env = {**os.environ, "TESTBED_STATE_DIR": str(env_state), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, name], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "held"  # the child says so once it holds the lease
    return proc


def test_a_held_lease_is_refused_naming_the_holder_then_waited_for(private_state):
    holder = hold("c1", private_state)
    try:
        with pytest.raises(ClusterBusy) as e, registry.lease("c1"):
            pass
        assert f"pid {holder.pid}" in str(e.value) and "`testbed sweep --name c1`" in str(e.value)
        assert "--wait" in str(e.value)
        assert registry.lease_status("c1")["pid"] == holder.pid  # what `status` shows, read without taking it
        got = threading.Event()

        def waiter():
            with registry.lease("c1", wait_s=60):
                got.set()

        t = threading.Thread(target=waiter)
        t.start()
        assert not got.is_set()
        holder.stdin.close()  # the holder ends: the waiter gets the lease
        t.join(60)
        assert got.is_set()
    finally:
        holder.kill()
        holder.wait()
    assert registry.lease_status("c1") is None


def test_a_killed_holder_never_blocks_anyone(private_state):
    holder = hold("c2", private_state)
    holder.kill()  # SIGKILL: the kernel drops its flock
    holder.wait()
    with registry.lease("c2"):
        assert registry.holder("c2")["pid"] == os.getpid()


def test_force_goes_ahead_only_when_the_recorded_holder_is_dead(private_state):
    import fcntl
    import json

    path = registry.lease_path("c3", "lease")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)  # someone keeps the lock (a child that inherited it)...
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        # a pid above the kernel's default pid_max (4194304 is its upper limit): no such process
        dead = {"pid": 2**22 + 1, "start_ticks": 1, "command": "testbed run --name c3", "started_at": 0}
        registry.lease_path("c3", "holder.json").write_text(json.dumps(dead))  # ...while the holder is dead
        with pytest.raises(ClusterBusy), registry.lease("c3"):
            pass
        with registry.lease("c3", force=True):
            assert registry.holder("c3")["pid"] == os.getpid()
        me = {"pid": os.getpid(), "start_ticks": registry.process_start_ticks(os.getpid()), "command": "x",
              "started_at": 0}  # fmt: skip
        registry.lease_path("c3", "holder.json").write_text(json.dumps(me))  # a live holder: --force is refused
        with pytest.raises(ClusterBusy, match="alive"), registry.lease("c3", force=True):
            pass
    finally:
        os.close(fd)


def test_a_planted_symlink_is_never_followed(private_state, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep")
    registry.lease_path("c4", "lease").symlink_to(target)
    with pytest.raises(ClusterError, match="cannot open"), registry.lease("c4"):
        pass
    assert target.read_text() == "keep"


def test_attempts_are_reserved_atomically(tmp_path, monkeypatch):
    """Two processes that both computed attempt 1 (the race): the directory decides, no attempt is shared."""
    a, b = ResultsStore(tmp_path), ResultsStore(tmp_path)
    monkeypatch.setattr(ResultsStore, "next_attempt", lambda self, trial_id: 1)
    da, db = a.trial_dir("t1"), b.trial_dir("t1")
    assert da != db and da.is_dir() and db.is_dir()
    row = {"trial_id": "t1", "status": "ok"}
    assert a.append(dict(row)).name == "t1.parquet"
    assert b.append(dict(row)).name == "t1.2.parquet"


def test_a_kept_row_is_stored_later_at_its_attempt(tmp_path):
    store = ResultsStore(tmp_path)
    store.trial_dir("t2")
    kept = store.keep_pending({"trial_id": "t2", "status": "ok", "iter_time_s_mean": 0.5}, 1)
    assert kept.parent == tmp_path / "trials" / "t2"
    assert store.store_pending() == [tmp_path / "rows" / "t2.parquet"]
    assert not kept.exists() and ResultsStore(tmp_path).find("t2")["iter_time_s_mean"] == 0.5
    assert ResultsStore(tmp_path).store_pending() == []
