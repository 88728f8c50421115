"""The provision role picks the torch build from what the host's driver supports (roles/testbed_host/tasks/
torch_build.yml), run by ansible-playbook on localhost with `nvidia-smi` output as the host would print it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's torch build choice
      ansible.builtin.include_role:
        name: testbed_host
        tasks_from: torch_build
    - name: Show the choice
      ansible.builtin.debug:
        msg: "CHOSEN={{ testbed_host_torch_build_chosen }}"
"""


def choose(tmp_path: Path, smi_stdout: str, build: str = "auto") -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    extra = {"testbed_host_nvidia_smi": {"stdout": smi_stdout}, "testbed_host_torch_build": build,
             "testbed_data_iface": "eth0"}  # fmt: skip
    return subprocess.run(
        [str(PLAYBOOK), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(extra)],
        capture_output=True, text=True, timeout=120, cwd=REPO / "ansible",
        env={"PATH": f"{PLAYBOOK.parent}:/usr/bin:/bin", "ANSIBLE_ROLES_PATH": str(REPO / "ansible" / "roles"),
             "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "HOME": str(tmp_path)},
    )  # fmt: skip


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not installed in the venv (the test extras)")
@pytest.mark.parametrize(
    "smi, build, chosen",
    [
        ("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |", "auto", "cu118"),
        ("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0     |", "auto", "cu130"),
        ("", "auto", "cpu"),  # no driver: a CPU build
        ("CUDA Version: 12.8", "cu126", "cu126"),  # named by the inventory: taken as is
    ],
)
def test_torch_build_follows_the_driver(tmp_path, smi, build, chosen):
    done = choose(tmp_path, smi, build)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"CHOSEN={chosen}" in done.stdout


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not installed in the venv (the test extras)")
def test_a_driver_older_than_every_build_fails_with_the_reason(tmp_path):
    done = choose(tmp_path, "CUDA Version: 11.2")
    assert done.returncode != 0
    assert "supports CUDA 11.2, older than every build" in done.stdout
