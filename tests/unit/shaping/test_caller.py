"""Where privilege begins in `python -m shaping`: through sudo (SUDO_UID set) or from a non-root caller, no state
directory, namespace or environment override; device names validated (and pinned by the sudo helper); --mgmt-addr
an address. Each refusal is one line, exit 2, and nothing is read or changed. (The same, through a real sudo rule,
is tests/security/test_sudo_helper.py.)"""

import pytest

from shaping import caller
from shaping.__main__ import main


def _run(capsys, argv, **kw):
    rc = main(argv, **kw)
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["confirm", "--dev", "lo", "--state-dir", "/tmp/x"], "--state-dir /tmp/x: not accepted through sudo"),
        (["show", "--dev", "lo", "--state-dir", "/tmp/x"], "--state-dir /tmp/x: not accepted through sudo"),
        (["apply", "--dev", "lo", "--bw", "1mbit", "--state-dir", "/tmp/x"], "--state-dir /tmp/x: not accepted"),
        (["confirm", "--dev", "lo", "--netns", "tbt-x"], "--netns tbt-x: not accepted through sudo"),
        (["apply", "--dev", "lo", "--bw", "1mbit", "--netns", "x", "--dry-run"], "--netns x: not accepted"),
        (["confirm", "--dev", "../../../../tmp/x/y"], "not an interface name"),
    ],
)
def test_refused_under_sudo(monkeypatch, capsys, tmp_path, argv, why):
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.chdir(tmp_path)
    rc, err = _run(capsys, argv)
    assert rc == 2 and why in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_environment_override_refused_under_sudo(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.setenv("TESTBED_SHAPING_STATE_DIR", str(tmp_path))
    rc, err = _run(capsys, ["show", "--dev", "lo"])
    assert rc == 2 and err.startswith("error: TESTBED_SHAPING_STATE_DIR is set: not accepted through sudo"), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("netns", ["../../proc/1/ns/net", "/proc/1/ns/net", "..", "a/b"])
def test_namespace_paths_refused_even_for_root(monkeypatch, capsys, netns):
    monkeypatch.delenv("SUDO_UID", raising=False)
    rc, err = _run(capsys, ["show", "--dev", "lo", "--netns", netns])
    assert rc == 2 and "not a namespace name" in err, err


def test_the_helper_pins_the_data_nic(monkeypatch, capsys):
    monkeypatch.setenv("SUDO_UID", "1000")
    rc, err = _run(capsys, ["show", "--dev", "lo"], data_ifaces=("data0",))
    assert rc == 2 and err == "error: --dev lo: this helper shapes only the host's data NIC (data0)"


@pytest.mark.parametrize("bad", ["notanip", "10.0.0.300", "", "10.0.0.0/24", "h1"])
def test_mgmt_addr_must_be_an_address(capsys, bad):
    rc, err = _run(capsys, ["apply", "--dev", "lo", "--bw", "10mbit", "--mgmt-addr", bad, "--dry-run"])
    assert rc == 2 and "--mgmt-addr" in err and "not an IP address" in err, err


def test_mgmt_addr_accepts_v4_and_v6(capsys):
    rc, _ = _run(capsys, ["apply", "--dev", "lo", "--bw", "10mbit", "--mgmt-addr", "192.0.2.1", "--mgmt-addr",
                          "2001:db8::1", "--dry-run"])  # fmt: skip
    assert rc == 0


def test_untrusted_is_sudo_or_not_root(monkeypatch):
    import os

    assert caller.untrusted({"SUDO_UID": "1000"})
    assert caller.untrusted({}) == (os.getuid() != 0 or os.geteuid() != 0)
