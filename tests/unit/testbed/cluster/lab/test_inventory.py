"""Lab inventory parsing, host checks and the host-side shaping CLI's input handling (no root, no network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shaping.__main__ import main as shaping_main
from shaping.lockout import ssh_client_addresses
from testbed.cluster.lab.cluster import LabCluster
from testbed.cluster.lab.facts import evaluate_facts
from testbed.cluster.lab.inventory import load_inventory
from testbed.errors import ClusterError, InputError

REPO = Path(__file__).resolve().parents[5]

INVENTORY = """
all:
  vars:
    ansible_user: ops
    testbed_gpus_per_host: 4
  children:
    testbed:
      vars:
        testbed_data_iface: ens1f0
        ansible_ssh_common_args: -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/etc/lab/known_hosts
      hosts:
        gpu01:
          ansible_host: 192.0.2.11
          ansible_port: 2222
        gpu02:
          ansible_host: 192.0.2.12
          testbed_data_iface: "ens2f0;touch /tmp/x"
          testbed_gpus_per_host: 0
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "inv.yml"
    p.write_text(text)
    return p


def test_inventory_merges_group_and_host_vars(tmp_path):
    specs = {s.name: s for s in load_inventory(_write(tmp_path, INVENTORY))}
    a, b = specs["gpu01"], specs["gpu02"]
    assert (a.ssh.address, a.ssh.port, a.ssh.user, a.gpus, a.data_iface) == ("192.0.2.11", 2222, "ops", 4, "ens1f0")
    assert a.ssh.known_hosts == "/etc/lab/known_hosts"
    assert (b.ssh.port, b.gpus, b.data_iface) == (22, 0, "ens2f0;touch /tmp/x")  # kept literally, never run
    assert a.python == "/opt/testbed/venv/bin/python" and a.data_address is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("all:\n  hosts:\n    h1: {}\n", "testbed_data_iface is missing"),
        ("all:\n  hosts: {}\n", "lists no hosts"),
        ("[all]\nh1\n", "reads YAML inventories"),
        ("- 1\n", "expected a YAML Ansible inventory"),
        ("all: [1, 2\n", "not valid YAML"),
        ("all:\n  hosts:\n    h1: {testbed_data_iface: eth0, ansible_port: ssh}\n", "must be integers"),
        ("all:\n  hosts:\n    h1: {testbed_data_iface: '{{ iface }}'}\n", "Jinja template"),
    ],
)
def test_inventory_errors_are_input_errors(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        load_inventory(_write(tmp_path, text))


def test_missing_inventory_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        LabCluster.from_inventory(tmp_path / "nope.yml")


def _facts(**kw):
    base = {
        "python": [3, 11, 7],
        "iface_exists": True,
        "ifaces": ["ens1f0", "lo"],
        "gpus": 4,
        "nvidia_smi": True,
        "nic_speed_mbps": 100000,
        "torch": "2.14.1",
        "project": True,
    }
    base.update(kw)
    return base


def test_evaluate_facts(tmp_path):
    spec = {s.name: s for s in load_inventory(_write(tmp_path, INVENTORY))}["gpu01"]
    assert evaluate_facts(spec, _facts(), rate_bps=9_000_000_000) == []
    ((cls, msg),) = evaluate_facts(spec, _facts(python=[3, 8, 10]))
    assert cls is ClusterError and "Python 3.8.10" in msg and "too old" in msg
    ((cls, msg),) = evaluate_facts(spec, _facts(gpus=0, nvidia_smi=False))
    assert "nvidia-smi shows 0 GPUs (nvidia-smi not found); pass --allow-cpu" in msg
    assert evaluate_facts(spec, _facts(gpus=0), allow_cpu=True) == []
    ((cls, msg),) = evaluate_facts(spec, _facts(nic_speed_mbps=25000), rate_bps=40_000_000_000)
    assert cls is InputError and "links at 25gbit, slower than the requested 40gbit" in msg
    assert evaluate_facts(spec, _facts(nic_speed_mbps=None), rate_bps=40_000_000_000) == []  # unknown speed
    ((cls, msg),) = evaluate_facts(spec, _facts(iface_exists=False))
    assert "no data interface 'ens1f0'" in msg and "the host has: ens1f0, lo" in msg


def test_ssh_client_addresses():
    assert ssh_client_addresses({"SSH_CONNECTION": "10.1.2.3 50000 10.1.2.4 22"}) == ["10.1.2.3"]
    assert ssh_client_addresses({"SSH_CLIENT": "::ffff:10.9.9.9 5 22"}) == ["10.9.9.9"]
    assert ssh_client_addresses({"SSH_CONNECTION": "fe80::1%eth0 1 fe80::2 22"}) == ["fe80::1"]
    assert ssh_client_addresses({"SSH_CONNECTION": "garbage"}) == []
    assert ssh_client_addresses({}) == []


def _cli(capsys, *argv):
    rc = shaping_main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_shaping_cli_dry_run_needs_no_root(capsys):
    rc, out, err = _cli(capsys, "apply", "--dev", "ens1f0", "--bw", "9gbit", "--ingress", "--dry-run")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == "tc qdisc replace dev ens1f0 root handle 7e57: htb default 1"
    assert "rate 9000000000bit" in lines[1] and "burst 1125000b" in lines[1]
    assert "ip link add ifb-ens1f0 type ifb" in lines
    assert any("action mirred egress redirect dev ifb-ens1f0" in ln for ln in lines)
    assert lines[-2].startswith("tc class replace dev ifb-ens1f0")
    assert lines[-1] == "tc qdisc replace dev ifb-ens1f0 parent 7e57:1 handle 7e59: bfifo limit 5625000"  # 5 ms at 9G


@pytest.mark.parametrize(
    "argv, message",
    [
        (["apply", "--dev", "x", "--bw", "9gbps", "--dry-run"], "ambiguous unit"),
        (["apply", "--dev", "x", "--bw", "50gbit", "--qdisc", "tbf", "--dry-run"], "32-bit limit"),
        (["apply", "--dev", "x", "--bw", "1gbit", "--confirm-within", "0"], "--confirm-within 0"),
        (["apply", "--dev", "x"], "required: --bw"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_shaping_cli_bad_input_one_line_exit_2(capsys, argv, message):
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_shaping_cli_module_entry_point():
    res = subprocess.run(
        [sys.executable, "-m", "shaping", "apply", "--dev", "x", "--bw", "100mbit", "--dry-run", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["plan"]["rate_bps"] == 100_000_000


ANSIBLE = Path(sys.executable).parent


@pytest.mark.skipif(not (ANSIBLE / "ansible-playbook").exists(), reason="ansible-core not installed in the venv")
def test_playbooks_syntax_check():
    res = subprocess.run(
        [
            str(ANSIBLE / "ansible-playbook"),
            "--syntax-check",
            "-i",
            "inventory.example.yml",
            *sorted(str(p.relative_to(REPO / "ansible")) for p in (REPO / "ansible" / "playbooks").glob("*.yml")),
        ],
        cwd=REPO / "ansible",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("provision", "shape", "teardown"):
        assert f"playbook: playbooks/{name}.yml" in res.stdout


# ansible-lint over playbooks and roles is not a test here: `make test` runs `make lint` first (Makefile `lint`:
# ansible-playbook --syntax-check and ansible-lint -q playbooks roles), and it took 12-48 CPU-s per suite run.


def test_roles_document_prefixed_variables():
    import yaml

    for role in ("testbed_host", "testbed_shaping"):
        defaults = (REPO / "ansible" / "roles" / role / "defaults" / "main.yml").read_text()
        names = list(yaml.safe_load(defaults))
        assert names and all(n.startswith(role + "_") for n in names), names
        lines = defaults.splitlines()
        for n in names:  # each variable has a comment right above it (or shares the block of the one above)
            i = next(i for i, ln in enumerate(lines) if ln.startswith(n + ":"))
            assert lines[i - 1].startswith("#") or lines[i - 1].split(":")[0] in names, n
        for sub in ("defaults", "tasks", "handlers", "meta"):
            assert (REPO / "ansible" / "roles" / role / sub / "main.yml").exists()


def test_hosts_whose_versions_disagree_are_named():
    from testbed.cluster.lab.facts import version_disagreements

    same = {"torch": "2.14.1", "cuda": "13.0", "nccl": "2.27.3", "driver_version": "580.65"}
    assert version_disagreements({"gpu01": same, "gpu02": dict(same)}) == []
    lines = version_disagreements({"gpu01": same, "gpu02": {**same, "nccl": "2.21.5"}, "gpu03": dict(same)})
    assert lines == [
        "hosts disagree on the NCCL version (2.21.5 on gpu02; 2.27.3 on gpu01, gpu03); install one version on every "
        "host (the provision playbook does, from one checkout)"
    ]
    # a host without a driver beside hosts with one is a disagreement too (a CPU host in a GPU job)
    assert "NVIDIA driver" in version_disagreements({"a": same, "b": {**same, "driver_version": None}})[0]


def test_lab_hosts_carry_their_inventory_gpus_unless_cpu_is_allowed(tmp_path):
    from testbed.cluster.lab.cluster import LabCluster

    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  children:\n    testbed:\n      hosts:\n        g1: {ansible_host: 192.0.2.1, testbed_data_address: "
        "198.51.100.1}\n      vars: {testbed_data_iface: ens3, testbed_gpus_per_host: 8, ansible_ssh_common_args: "
        "'-o UserKnownHostsFile=/dev/null'}\n"
    )
    assert LabCluster.from_inventory(inv).hosts()[0].gpus == tuple(range(8))
    assert LabCluster.from_inventory(inv, allow_cpu=True).hosts()[0].gpus == ()
