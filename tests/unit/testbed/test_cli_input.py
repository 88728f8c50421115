"""The CLI's bad-input contract without root: exit 2, one line on stderr, nothing changed; and `shape --dry-run`.

Anything that would touch the machine (building namespaces, applying or clearing qdiscs) is replaced by a trap that
fails the test, so a validation that regressed shows up as a failure here instead of as a half-built cluster.
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO, one_line, random_suffix

from testbed import cli
from testbed.cluster import local


class Touched(AssertionError):
    pass


def _trap(*args, **kwargs):
    raise Touched(f"the CLI tried to change the machine on bad input: {args} {kwargs}")


@pytest.fixture
def no_changes(monkeypatch, state_dir):
    """Trap every call that changes the machine; yield a snapshot function of the state directory."""
    monkeypatch.setattr(local, "_build", _trap)
    monkeypatch.setattr(local, "_destroy", _trap)
    monkeypatch.setattr(local.tc, "apply", _trap)
    monkeypatch.setattr(local.tc, "clear", _trap)
    monkeypatch.delenv("TESTBED_CLUSTER", raising=False)

    def snapshot():
        return sorted((str(p.relative_to(state_dir)), p.stat().st_mtime_ns) for p in state_dir.rglob("*"))

    return snapshot


def run_main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


BAD_INPUT = [
    (["up", "--bw", "9gbps"], "ambiguous unit"),
    (["up", "--bw", "100mbps"], "ambiguous unit"),
    (["up", "--bw", "0"], "out of range"),
    (["up", "--bw", "500gbit"], "out of range"),
    (["up", "--bw", "garbage"], "not a number"),
    (["up", "--bw=-5mbit"], "not a number"),
    (["up", "--hosts", "0"], "--hosts 0"),
    (["up", "--hosts", "65"], "--hosts 65"),
    (["up", "--qdisc", "tbf", "--bw", "40gbit"], "32-bit"),
    (["up", "--qdisc", "cake", "--bw", "1gbit"], "accepted htb, tbf"),
    (["up", "--bw", "1gbit", "--burst", "10kbit"], "bytes, not bits"),
    (["up", "--bw", "1gbit", "--burst", "1000"], "smaller than one frame"),
    (["up", "--bw", "1gbit", "--jitter", "1ms"], "--jitter needs --delay"),
    (["up", "--delay", "5ms"], "--delay needs --bw"),
    (["up", "--bw", "1gbit", "--loss", "200%"], "out of range"),
    (["up", "--subnet", "8.8.8.0/24"], "not a private range"),
    (["up", "--subnet", "10.9.0.0/30", "--hosts", "4"], "room for 2 hosts"),
    (["up", "--subnet", "10.9.0.1/24"], "--subnet"),
    (["shape", "--bw", "1gbit"], "no cluster named"),
    (["shape", "--bw", "9gbps"], "ambiguous unit"),
    (["shape"], "shape needs --bw RATE or --clear"),
    (["shape", "--bw", "1gbit", "--clear"], "exclude each other"),
    (["status"], "no cluster named"),
    (["exec", "h0", "--", "true"], "no cluster named"),
    (["probe", "--streams", "0"], "--streams 0"),
    (["probe", "--duration", "0.1"], "--duration 0.1"),
    (["probe", "--streams", "one"], "comma-separated integers"),
    (["probe"], "no cluster named"),
]


@pytest.mark.parametrize(("argv", "why"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_exits_2_with_one_line_and_changes_nothing(capsys, no_changes, argv, why):
    name = "t" + random_suffix()
    before = no_changes()
    rc, out, err = run_main(capsys, argv[0], "--name", name, *argv[1:])
    assert rc == 2
    line = one_line(err)
    assert line.startswith(f"testbed {argv[0]}: error: ")
    assert why in line
    assert no_changes() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--name", "BAD-NAME"],
        ["up", "--name", "1abc"],
        ["up", "--name", "abcdefghijk"],
        ["up", "--name", ""],
        ["down", "--name", "BAD-NAME"],
        ["shape", "--name", "a_b", "--bw", "1gbit"],
    ],
)
def test_bad_cluster_name(capsys, no_changes, argv):
    before = no_changes()
    rc, _, err = run_main(capsys, *argv)
    assert rc == 2
    assert "cluster names are 1-10 characters" in one_line(err)
    assert no_changes() == before


@pytest.mark.parametrize("argv", [["up", "--hosts", "two"], ["up", "--bw"], ["frobnicate"], ["shape", "--nope"]])
def test_argparse_errors_are_one_line_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "error:" in one_line(capsys.readouterr().err)


def test_real_process_exit_code_and_no_traceback(cli_env):
    done = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "up", "--name", "t" + random_suffix(), "--bw", "9gbps"],
        env=cli_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        "testbed up: error: --bw 9gbps: ambiguous unit; tc reads gbps as bytes/s (72gbit), most people mean bits/s "
        "(9gbit). Write 9gbit or 72gbit"
    )
    assert done.stdout == ""


def test_debug_flag_shows_the_traceback(cli_env):
    done = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "--debug", "up", "--name", "t" + random_suffix(), "--bw", "0"],
        env=cli_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "InputError" in done.stderr


# ---------------------------------------------------------------------------------------------- --dry-run
@pytest.fixture
def recorded_cluster(state_dir):
    """A cluster record as `up` writes it (2 hosts), without creating anything: enough for --dry-run."""
    name = "t" + random_suffix()
    record = {
        "name": name,
        "backend": "local",
        "subnet": "10.77.0.0/24",
        "shape": None,
        "namespaces": [f"tb-{name}-sw", f"tb-{name}-h0", f"tb-{name}-h1"],
        "hosts": [
            {"name": f"h{i}", "address": f"10.77.0.{i + 1}", "data_iface": "eth0", "netns": f"tb-{name}-h{i}",
             "switch_port": f"h{i}"}
            for i in range(2)
        ],
        "created_at": 0.0,
    }  # fmt: skip
    path = state_dir / "clusters" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    yield name
    path.unlink(missing_ok=True)


def test_dry_run_prints_100g_htb_plan_for_both_ends_and_changes_nothing(capsys, no_changes, recorded_cluster):
    name = recorded_cluster
    before = no_changes()
    rc, out, err = run_main(capsys, "shape", "--name", name, "--bw", "100gbit", "--dry-run")
    assert rc == 0, err
    assert no_changes() == before
    expected = []
    for i in range(2):
        for header, ns, dev in ((f"upload tb-{name}-h{i}/eth0", f"tb-{name}-h{i}", "eth0"),
                                (f"download tb-{name}-sw/h{i}", f"tb-{name}-sw", f"h{i}")):  # fmt: skip
            expected += [
                f"# {header}",
                f"tc -n {ns} qdisc replace dev {dev} root handle 7e57: htb default 1",
                f"tc -n {ns} class replace dev {dev} parent 7e57: classid 7e57:1 htb rate 100000000000bit "
                "ceil 100000000000bit burst 12500000b cburst 12500000b quantum 200000",
            ]
    assert out.splitlines() == expected


def test_dry_run_one_host_with_netem_and_clear(capsys, no_changes, recorded_cluster):
    name = recorded_cluster
    rc, out, _ = run_main(
        capsys, "shape", "--name", name, "--hosts", "h1", "--bw", "1gbit", "--delay", "5ms", "--loss", "1%", "--dry-run"
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"# upload tb-{name}-h1/eth0"
    assert f"tc -n tb-{name}-h1 qdisc replace dev eth0 parent 7e57:1 handle 7e58: netem delay 5000us loss 1%" in lines
    assert f"tc -n tb-{name}-sw qdisc replace dev h1 parent 7e57:1 handle 7e58: netem delay 5000us loss 1%" in lines
    assert not any("-h0" in line or "dev h0" in line for line in lines)
    rc, out, _ = run_main(capsys, "shape", "--name", name, "--clear", "--dry-run")
    assert rc == 0
    assert f"tc -n tb-{name}-sw qdisc del dev h1 root handle 7e57:" in out.splitlines()


def test_dry_run_still_validates(capsys, no_changes, recorded_cluster):
    rc, _, err = run_main(capsys, "shape", "--name", recorded_cluster, "--bw", "40gbit", "--qdisc", "tbf", "--dry-run")
    assert rc == 2
    assert "32-bit" in one_line(err)
    rc, _, err = run_main(capsys, "shape", "--name", recorded_cluster, "--hosts", "h7", "--bw", "1gbit", "--dry-run")
    assert rc == 2
    assert "unknown host 'h7'" in one_line(err)
