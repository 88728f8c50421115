"""Shaping without root SSH: with `ansible_become: true` the lab backend runs the shaping CLI as
`sudo -n <helper> ...`; the helper (installed by the testbed_host role) imports only from the project directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jinja2
import pytest

from testbed.cluster.lab.cluster import LabCluster
from testbed.cluster.lab.remote import command_for

REPO = Path(__file__).resolve().parents[5]
INVENTORY = """
all:
  hosts:
    gpu01: {ansible_host: 192.0.2.11, testbed_data_address: 198.51.100.11%s}
    gpu02: {ansible_host: 192.0.2.12, testbed_data_address: 198.51.100.12}
  vars:
    ansible_user: alice
    testbed_data_iface: ens1f0
"""


def _cluster(tmp_path: Path, extra: str = "") -> LabCluster:
    p = tmp_path / "inv.yml"
    p.write_text(INVENTORY % extra)
    return LabCluster.from_inventory(p)


def test_become_runs_the_helper_through_sudo_n(tmp_path):
    c = _cluster(tmp_path, ", ansible_become: true")
    sudo, plain = c.specs["gpu01"], c.specs["gpu02"]
    argv = c._shaping_argv(sudo, "apply", "--dev", "ens1f0", "--bw", "1000000000", "--json")
    assert argv == ["sudo", "-n", "/usr/local/sbin/testbed-shaping", "apply", "--dev", "ens1f0", "--bw",
                    "1000000000", "--json"]  # fmt: skip
    assert command_for(argv) == "sudo -n /usr/local/sbin/testbed-shaping apply --dev ens1f0 --bw 1000000000 --json"
    assert c._shaping_argv(plain, "show", "--dev", "ens1f0")[:3] == ["/opt/testbed/venv/bin/python", "-m", "shaping"]


def test_become_helper_path_from_the_inventory(tmp_path):
    c = _cluster(tmp_path, ", ansible_become: yes, testbed_shaping_helper: /opt/lab/bin/shape")
    assert c._shaping_argv(c.specs["gpu01"], "clear", "--dev", "ens1f0")[:3] == ["sudo", "-n", "/opt/lab/bin/shape"]


def test_every_shaping_command_of_apply_goes_through_sudo(tmp_path, monkeypatch):
    """apply (with its confirm over a fresh connection): each shaping command line starts with sudo -n."""
    from testbed.cluster.lab import cluster as lab

    c = _cluster(tmp_path, ", ansible_become: true")
    seen: list[list[str]] = []

    def fake_run(self, host, argv, *, timeout_s=60.0):
        seen.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, json.dumps({"changed": True}) + "\n", "")

    class FakeConnection:
        def __init__(self, *a, **k): ...

        def run(self, argv, **_k):
            seen.append(list(argv))
            return subprocess.CompletedProcess(argv, 0, "{}\n", "")

        def close(self): ...

    monkeypatch.setattr(LabCluster, "run", fake_run)
    monkeypatch.setattr(lab, "SSHConnection", FakeConnection)
    from shaping.plan import LinkShape

    c.apply_shaping(LinkShape(10**9), [c.host("gpu01")])
    assert [a[:4] for a in seen] == [["sudo", "-n", "/usr/local/sbin/testbed-shaping", "apply"],
                                     ["sudo", "-n", "/usr/local/sbin/testbed-shaping", "confirm"]]  # fmt: skip
    assert "--peers" in seen[0] and "198.51.100.12/32" in seen[0]


def _render(name: str, **vars_) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "ansible/roles/testbed_host/templates"))
    env.filters["quote"] = lambda s: "'" + str(s).replace("'", "'\\''") + "'"
    return env.get_template(name).render(**vars_)


def test_helper_imports_only_the_project_and_sudoers_names_only_it(tmp_path):
    import sys

    helper = tmp_path / "testbed-shaping"
    helper.write_text(_render("testbed-shaping.sh.j2", testbed_host_project_dir=str(REPO),
                              testbed_host_python=sys.executable, testbed_host_data_iface="eth0"))  # fmt: skip
    helper.chmod(0o755)
    trap = tmp_path / "cwd" / "shaping"  # a `shaping` package where the caller stands must not be what runs
    trap.mkdir(parents=True)
    (trap / "__init__.py").write_text("")
    (trap / "__main__.py").write_text("raise SystemExit('the caller''s package ran')\n")
    done = subprocess.run([str(helper), "apply", "--dev", "eth0", "--bw", "1gbit", "--dry-run", "--json"],
                          cwd=trap.parent, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(trap.parent)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dry_run"] is True
    other = subprocess.run([str(helper), "apply", "--dev", "eth1", "--bw", "1gbit", "--dry-run"], capture_output=True,
                           text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert other.returncode == 2 and "only the host's data NIC (eth0)" in other.stderr  # pinned to the data NIC
    rule = _render("testbed-shaping.sudoers.j2", testbed_host_shaping_sudo_users=["alice", "bob"],
                   testbed_host_shaping_helper="/usr/local/sbin/testbed-shaping")  # fmt: skip
    lines = [ln for ln in rule.splitlines() if ln and not ln.startswith("#")]
    h = "/usr/local/sbin/testbed-shaping"
    commands = ", ".join(f"{h} {c} *" for c in ("apply", "confirm", "rollback", "clear", "show"))  # no kernel-check
    assert lines == [f"Defaults!{h} env_reset, !setenv", f"alice ALL=(root) NOPASSWD: {commands}",
                     f"bob ALL=(root) NOPASSWD: {commands}"]  # fmt: skip


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_bad_become_value(tmp_path, value):
    from testbed.errors import InputError

    with pytest.raises(InputError, match="ansible_become"):
        _cluster(tmp_path, f", ansible_become: '{value}'")
