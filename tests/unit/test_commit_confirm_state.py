"""Commit-confirm timers are bounded and leave nothing behind after `forget` (what `testbed down` runs on lab hosts).

No tc here: the armed timer waits far longer than the test, and `forget` ends it before it could restore anything.
"""

import math
from pathlib import Path

import pytest
from conftest import wait_for

from shaping import commit_confirm
from testbed.errors import InputError


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
    wait_for(lambda: commit_confirm._timer_alive(commit_confirm.pending(dev, base=base)), 10, f"{dev}'s timer")


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
