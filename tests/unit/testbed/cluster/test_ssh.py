"""Remote command building: every word reaches the remote program literally (no shell injection)."""

from __future__ import annotations

import subprocess

import pytest

from testbed.cluster.lab.remote import kill_group_script, poll_status_line
from testbed.cluster.ssh import command_line, detached_command_line, env_file_text, private_dir_line
from testbed.errors import InputError, LaunchError

NASTY = [
    "data0;touch /tmp/pwned",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "a b\tc\nd",
    "it's",
    '"dq"',
    "*",
    "--flag=~root",
    "&& exit 7 ||",
    "",
]


def _sh(line: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=10)


def test_command_line_passes_every_word_literally(tmp_path):
    line = command_line(["printf", "%s\\n", *NASTY], cwd=str(tmp_path))
    res = _sh(line)
    assert res.returncode == 0
    assert res.stdout.split("\n")[:-1] == [w for w in NASTY for w in w.split("\n")]
    assert not (tmp_path / "pwned").exists()


def test_env_values_are_literal_and_names_validated(tmp_path):
    marker = tmp_path / "pwned"
    line = command_line(["sh", "-c", 'printf "%s" "$X"'], env={"X": f"$(touch {marker}); `id`"})
    assert _sh(line).stdout == f"$(touch {marker}); `id`"
    assert not marker.exists()
    with pytest.raises(InputError, match="environment variable name"):
        command_line(["true"], env={"X;touch /tmp/x": "1"})
    with pytest.raises(InputError, match="empty command"):
        command_line([])


def test_cwd_with_metacharacters_is_one_directory(tmp_path):
    marker = tmp_path / "pwned"
    res = _sh(command_line(["true"], cwd=f"/nonexistent;touch {marker}"))
    assert res.returncode != 0 and not marker.exists()


def test_detached_command_writes_pid_rc_and_log(tmp_path):
    """The process's files live in the private directory made just before; its environment arrives on stdin (never
    on the command line), is sourced and the 0600 file deleted before the program starts."""
    import os
    import stat
    import time

    d = tmp_path / "run" / "tb-c-h0-abc"
    line = (
        private_dir_line(tmp_path / "run", d.name)
        + " && "
        + detached_command_line(
            ["sh", "-c", 'echo "out $A"; exit 5'], run_dir=d, cwd=str(tmp_path), marker="TESTBED_LAB_TOKEN=t1"
        )
    )
    assert "x;y" not in line and "secret" not in line
    env = env_file_text({"A": "x;y", "B": "secret $(touch pwned)\n'q'"})
    res = subprocess.run(["sh", "-c", line], input=env, capture_output=True, timeout=10)
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    deadline = time.monotonic() + 10
    while not ((d / "rc").exists() and (d / "rc").read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (d / "rc").read_text().strip() == "5"
    assert (d / "log").read_text() == "out x;y\n"
    assert int((d / "pid").read_text()) > 1
    assert not (d / "env").exists() and not (tmp_path / "pwned").exists()
    # the same name again (planted, or reused) is refused; the environment is never written there
    again = _sh(private_dir_line(tmp_path / "run", d.name))
    assert again.returncode == 3 and "exists already" in again.stderr
    with pytest.raises(InputError, match="environment variable name"):
        env_file_text({"X;touch /tmp/x": "1"})


def test_private_dir_refuses_a_run_dir_of_another_user_or_a_link(tmp_path):
    os_ = __import__("os")
    if os_.geteuid() != 0:
        pytest.skip("needs root: chowns a directory to another uid")
    other = tmp_path / "other"
    other.mkdir()
    os_.chown(other, 65534, 65534)
    res = _sh(private_dir_line(other, "tb-c-x"))
    assert res.returncode == 3 and "belongs to another user" in res.stderr and not (other / "tb-c-x").exists()
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    res = _sh(private_dir_line(loose, "tb-c-x"))
    assert res.returncode == 3 and "writable by others and not sticky" in res.stderr
    link = tmp_path / "link"
    link.symlink_to(other)
    os_.lchown(link, 65534, 65534)
    res = _sh(private_dir_line(link, "tb-c-x"))
    assert res.returncode == 3 and "link made by another user" in res.stderr


def test_kill_group_script_refuses_bad_groups():
    for bad in (0, 1, -5, "12; rm -rf /"):
        with pytest.raises(LaunchError):
            kill_group_script(bad, "tok", 1.0)
    script = kill_group_script(4242, "h0-abc", 1.0)
    assert "kill -TERM -- -4242" in script and "TESTBED_LAB_TOKEN=h0-abc" in script
    assert script.startswith("grep -qz")  # checks the token before signalling anything


def test_poll_reads_the_status_written_while_it_checked_liveness(tmp_path):
    """The leader writes its status and exits between poll's first read and its liveness check: a `grep` that writes
    the status file as it runs stands in for that moment. The poll must print the status, not "gone" (which the
    launcher reads as killed, -9)."""
    import os

    rc = tmp_path / "r.rc"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "grep").write_text(f"#!/bin/sh\necho 0 > {rc}\nexit 1\n")
    (bin_dir / "grep").chmod(0o755)
    line = poll_status_line(str(rc), "t1", 999_999_999)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=10, env=env).stdout.strip()
    assert out == "0"
    rc.unlink()  # no status and no leader: killed
    assert _sh(poll_status_line(str(rc), "t1", 999_999_999)).stdout.strip() == "gone"
    rc.write_text("3\n")
    assert _sh(poll_status_line(str(rc), "t1", 999_999_999)).stdout.strip() == "3"
