"""Commit-confirm timers are bounded and leave nothing behind after `forget` (what `testbed down` runs on lab hosts).

No tc here: the armed timer waits far longer than the test, and `forget` ends it before it could restore anything.
"""

import math
from pathlib import Path

import pytest

from shaping import commit_confirm
from testbed.errors import InputError
from tests.conftest import wait_for


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, 3600.5, 86400, True])
def test_confirm_within_must_be_finite_and_bounded(bad):
    with pytest.raises(InputError, match=r"--confirm-within .*seconds in \(0, 3600\]"):
        commit_confirm.check_within(bad)


def test_arm_refuses_an_unbounded_timer_before_writing_anything(tmp_path):
    with pytest.raises(InputError, match="--confirm-within inf"):
        commit_confirm.arm("tbtest0", {}, {}, math.inf, base=tmp_path)
    assert list(tmp_path.iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _started(dev: str, base: Path) -> None:
    """Wait until the timer runs as itself (between fork and exec its command line is still the parent's)."""
    path = commit_confirm._record_path(commit_confirm.state_dir(base=base), dev)
    wait_for(lambda: commit_confirm._timer_alive(commit_confirm.pending(dev, base=base), path), 10, f"{dev}'s timer")


def test_forget_ends_the_timer_and_removes_the_state(tmp_path):
    armed = commit_confirm.arm("tbtest0", {"egress": {}, "ingress": {}}, {"dev": "tbtest0"}, 600, base=tmp_path)
    _started("tbtest0", tmp_path)
    sdir = commit_confirm.state_dir(base=tmp_path)
    assert _alive(armed["timer_pid"]) and (sdir / "tbtest0.pending.json").is_file()
    out = commit_confirm.forget("tbtest0", base=tmp_path)
    assert out == {"dev": "tbtest0", "timer_ended": True, "state_removed": True}
    wait_for(lambda: not _alive(armed["timer_pid"]), 10, "the timer process to end")
    assert not sdir.exists() and list(tmp_path.iterdir()) == []


def test_forget_keeps_another_devices_pending_change(tmp_path):
    commit_confirm.arm("tbtest0", {}, {}, 600, base=tmp_path)
    other = commit_confirm.arm("tbtest1", {}, {}, 600, base=tmp_path)
    _started("tbtest0", tmp_path)
    _started("tbtest1", tmp_path)
    try:
        out = commit_confirm.forget("tbtest0", base=tmp_path)
        assert out["timer_ended"] and not out["state_removed"]
        sdir = commit_confirm.state_dir(base=tmp_path)
        assert sorted(p.name for p in sdir.iterdir() if not p.name.startswith(".")) == [
            "tbtest1.pending.json",
            "tbtest1.timer.log",
        ]
        assert _alive(other["timer_pid"])
    finally:
        commit_confirm.forget("tbtest1", base=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_forget_without_state_is_a_no_op(tmp_path):
    assert commit_confirm.forget("tbtest0", base=tmp_path) == {
        "dev": "tbtest0",
        "timer_ended": False,
        "state_removed": False,
    }
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ what a forged record cannot reach
def _sleeper():
    import subprocess

    proc = subprocess.Popen(["sleep", "600"])
    return proc


def test_a_forged_record_never_names_a_process_to_kill(tmp_path):
    """Empty, non-hex and foreign tokens, pid 1, a bool pid and a process that is not the timer: none is 'alive'."""
    sleeper = _sleeper()
    try:
        path = tmp_path / "tbtest0.pending.json"
        for record in (
            {"timer_pid": sleeper.pid, "token": ""},  # an empty token used to match any command line
            {"timer_pid": sleeper.pid, "token": "600"},  # not hex of the timer's length
            {"timer_pid": sleeper.pid, "token": "0123456789abcdef"},  # well-formed, but sleep is no timer
            {"timer_pid": 1, "token": "0123456789abcdef"},
            {"timer_pid": True, "token": "0123456789abcdef"},
            {"timer_pid": str(sleeper.pid), "token": "0123456789abcdef"},
        ):
            assert not commit_confirm._timer_alive(record, path), record
            commit_confirm._stop_timer(record, path)
        assert sleeper.poll() is None  # still running: nothing was sent to it
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_real_timer_is_recognised_only_for_its_own_record(tmp_path):
    armed = commit_confirm.arm("tbtest0", {}, {}, 600, base=tmp_path)
    try:
        _started("tbtest0", tmp_path)
        sdir = commit_confirm.state_dir(base=tmp_path)
        record = commit_confirm.pending("tbtest0", base=tmp_path)
        assert commit_confirm._timer_alive(record, sdir / "tbtest0.pending.json")
        assert not commit_confirm._timer_alive(record, sdir / "tbtest1.pending.json")  # another record's path
        assert not commit_confirm._timer_alive({**record, "token": "f" * 16}, sdir / "tbtest0.pending.json")
        cmdline = Path(f"/proc/{armed['timer_pid']}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1] == b"-I"  # isolated mode: no PYTHONPATH, user site or cwd on the timer's sys.path
        env = Path(f"/proc/{armed['timer_pid']}/environ").read_bytes().split(b"\0")
        assert not [e for e in env if e.startswith(b"PYTHON")]
    finally:
        commit_confirm.forget("tbtest0", base=tmp_path)


@pytest.mark.parametrize("dev", ["../../../../tmp/x/y", "..", ".", "a/b", "eth0\nroot", "", "x" * 16, "eth 0"])
def test_device_names_are_validated_before_they_become_file_names(tmp_path, dev):
    with pytest.raises(InputError, match="--dev .*not an interface name"):
        commit_confirm.pending(dev, base=tmp_path)
    with pytest.raises(InputError, match="not an interface name"):
        commit_confirm.arm(dev, {}, {}, 600, base=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("netns", ["../../proc/1/ns/net", "/proc/1/ns/net", "..", "a/b", ""])
def test_namespace_names_are_never_paths(tmp_path, netns):
    with pytest.raises(InputError, match="--netns .*not a namespace name"):
        commit_confirm.state_dir(netns, base=tmp_path)


def test_a_planted_lock_link_is_refused_and_its_target_kept(tmp_path):
    import os

    victim = tmp_path / "victim"
    victim.write_text("root's data\n")
    base = tmp_path / "state"
    base.mkdir(mode=0o700)
    sdir = commit_confirm.state_dir(base=base)
    sdir.mkdir(mode=0o700)
    os.symlink(victim, sdir / ".lock")
    with pytest.raises(commit_confirm.ShapingError, match="symbolic link"):
        commit_confirm.arm("tbtest0", {}, {}, 600, base=base)
    assert victim.read_text() == "root's data\n"
    assert not (sdir / "tbtest0.pending.json").exists()


def test_a_planted_log_link_is_refused_and_its_target_kept(tmp_path):
    import os

    victim = tmp_path / "victim"
    victim.write_text("root's data\n")
    sdir = commit_confirm.state_dir(base=tmp_path)
    sdir.mkdir(mode=0o700)
    os.symlink(victim, sdir / "tbtest0.timer.log")
    with pytest.raises(commit_confirm.ShapingError, match="symbolic link"):
        commit_confirm.arm("tbtest0", {}, {}, 600, base=tmp_path)
    assert victim.read_text() == "root's data\n"
    commit_confirm.forget("tbtest0", base=tmp_path)


@pytest.mark.parametrize("how", ["link", "group-writable", "world-writable-state"])
def test_a_state_directory_others_could_change_is_refused(tmp_path, how):
    import os

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    if how == "link":
        base = tmp_path / "base"
        os.symlink(real, base)
    elif how == "group-writable":
        base = real
        os.chmod(base, 0o770)
    else:
        base = real
        commit_confirm.state_dir(base=base).mkdir(mode=0o700)
        os.chmod(commit_confirm.state_dir(base=base), 0o777)
    with pytest.raises(commit_confirm.ShapingError, match="state directory .*refusing"):
        commit_confirm.arm("tbtest0", {}, {}, 600, base=base)
    assert not list(real.rglob("*.pending.json"))
