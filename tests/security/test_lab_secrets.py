"""Secrets and paths on lab hosts, attacked from a second local account on the host (the throwaway user).

On the namespaced SSH lab (tests/integration/labhosts.py: real sshd in namespaces; the hosts share this machine's
filesystem and process table, as users of one lab machine share /tmp and `ps`):
- a rank started with a secret in its environment runs, and no command line on the host shows the secret, while the
  rank's own /proc/PID/environ has it;
- every process and every attempt gets a fresh 0700 directory of the login user (lstat: not a link); a run directory
  or a link planted by another user is refused, and nothing planted at the old fixed location is followed or fetched;
- the provision run packs only the package files, in a private directory of its own, removed after the run;
- `--accept-new-host-keys` records an unknown host key but refuses a changed one, for ansible-playbook too.
Needs root, sshd and ansible-playbook.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from tests.conftest import random_suffix
from tests.integration.labhosts import PYTHON, create_lab_hosts, wait_for

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces and runs sshd"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server (/usr/sbin/sshd)"),
    pytest.mark.xdist_group("test_lab_secrets"),  # the module's lab on one xdist worker
]

SECRET = "s3cret-" + random_suffix(8)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    hosts = create_lab_hosts(tmp_path_factory.mktemp("seclab"), n_hosts=1)  # every test here works on h0
    try:
        yield hosts
    finally:
        problems = hosts.teardown()
        assert not problems, problems


@pytest.fixture
def shared_tmp():
    """A directory like /tmp (root's, mode 1777: every user may create entries there), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="tbsec-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _cluster(lab, name: str, **group_vars):
    from testbed.cluster.lab.cluster import LabCluster

    return LabCluster.from_inventory(lab.write_inventory(f"{name}.yml", **group_vars), name=name)


def _h0_inventory(lab, file: str, **group_vars) -> Path:
    """An inventory of h0 alone (a playbook run against one host)."""
    inv = lab.inventory(**group_vars)
    hosts = inv["all"]["children"]["testbed"]["hosts"]
    for name in [n for n in hosts if n != "h0"]:
        del hosts[name]
    return lab.write_inventory(file, inventory=inv)


def _ansible_env(lab, monkeypatch, tmp_path: Path) -> None:
    """The lab's Ansible settings (private ANSIBLE_HOME) for the playbook run_playbook starts, with SSH control
    sockets of this test's own (a master connection another test left open would skip the host key check)."""
    for key, value in lab.ansible_env().items():
        if key.startswith("ANSIBLE_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(tmp_path / "cp"))


def _cmdlines() -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def _group_members(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True, check=True).stdout
    return [int(a) for a, b in (ln.split() for ln in out.splitlines()) if int(b) == pgid]


def test_a_secret_in_a_ranks_environment_is_on_no_command_line(lab, tmp_path):
    c = _cluster(lab, "tbs" + random_suffix(4))
    p = c.start("h0", ["sleep", "300"], env={"API_TOKEN": SECRET, "ODD": "a'b $(x)\nc"}, log_path=tmp_path / "s.log")
    try:
        wait_for(lambda: len(_group_members(p.pgid)) >= 2, 15, "the rank (sleep) under its shell")
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert SECRET not in ps
        assert not [c for c in _cmdlines() if SECRET in c]
        rank = next(pid for pid in _group_members(p.pgid) if pid != p.pgid)
        environ = Path(f"/proc/{rank}/environ").read_bytes().split(b"\0")
        assert f"API_TOKEN={SECRET}".encode() in environ and b"ODD=a'b $(x)\nc" in environ
        # its files: a fresh directory of the login user, 0700, not a link; the environment file is gone
        d = Path(p.remote["dir"])
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert sorted(x.name for x in d.iterdir()) == ["log", "pid"]
    finally:
        p.kill_group()
        c.close()
    assert not Path(p.remote["dir"]).exists()  # removed once the log was copied


def test_a_run_directory_of_another_user_or_a_link_is_refused(lab, unprivileged_user, shared_tmp, tmp_path):
    from testbed.errors import LaunchError

    user = unprivileged_user
    theirs, link, target = shared_tmp / "theirs", shared_tmp / "link", shared_tmp / "target"
    for argv in (["mkdir", "-m", "777", str(theirs)], ["mkdir", "-m", "777", str(target)],
                 ["ln", "-s", str(target), str(link)]):  # fmt: skip
        assert user.run(argv).returncode == 0
    for run_dir, said in ((theirs, "belongs to another user"), (link, "is a link made by another user")):
        c = _cluster(lab, "tbs" + random_suffix(4), testbed_run_dir=str(run_dir))
        with pytest.raises(LaunchError, match=said):
            c.start("h0", ["true"], env={"API_TOKEN": SECRET}, log_path=tmp_path / "r.log")
        c.close()
    assert list(theirs.iterdir()) == [] and list(target.iterdir()) == []  # nothing made, nothing written there


def test_what_another_user_planted_is_not_followed_nor_fetched(lab, unprivileged_user, shared_tmp, tmp_path):
    """The old layout (<run_dir>/<cluster>/{logs,pids,trials/<trial id>}) planted by the throwaway user: links to a
    directory of theirs and a forged summary.json. A rank that writes one record: only that record comes back."""
    user = unprivileged_user
    name, trial_id = "tbs" + random_suffix(4), "0123456789abcdef"
    old, catch = shared_tmp / name, shared_tmp / "catch"
    forged = old / "trials" / trial_id / "summary.json"
    plant = (f"mkdir -m 777 {catch} {old} && ln -s {catch} {old}/logs && ln -s {catch} {old}/pids && "
             f"mkdir -p {forged.parent} && echo '{{\"iter_time_s_mean\": 0.001}}' > {forged}")  # fmt: skip
    assert user.run(["sh", "-c", plant]).returncode == 0
    c = _cluster(lab, name, testbed_run_dir=str(shared_tmp))
    try:
        out = c.rank_out_dir(tmp_path / "trial", trial_id)
        assert c.rank_out_dir(tmp_path / "trial", trial_id) != out  # per attempt, never reused
        out = c.rank_out_dir(tmp_path / "trial", trial_id)
        p = c.start("h0", ["sh", "-c", f'echo real > "{out}/rank0.json"'], env={}, log_path=tmp_path / "r.log")
        assert p.wait(timeout_s=30) == 0, (tmp_path / "r.log").read_text()
        st = os.lstat(out)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode)
        c.fetch("h0", out, tmp_path / "trial")
    finally:
        c.close()
    assert sorted(x.name for x in (tmp_path / "trial").iterdir()) == ["rank0.json"]  # no forged summary.json
    assert not Path(out).exists()  # removed after the fetch
    assert list(catch.iterdir()) == []  # no log, pid or status file went through the planted links
    assert forged.read_text().strip() == '{"iter_time_s_mean": 0.001}'


ANSIBLE_PLAYBOOK = Path(PYTHON).parent / "ansible-playbook"


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs ansible-playbook in the venv (ansible-core)")
def test_the_provision_archive_is_private_per_run_and_holds_only_the_package(lab, tmp_path, monkeypatch):
    """A real provision run until pip (which cannot reach a torch index here and fails): the role packs what the
    controller staged, in a private directory of the run, and unpacks only the package files on the host."""
    from testbed.cluster.lab.cluster import LabCluster
    from testbed.errors import ClusterError

    project = tmp_path / "project"
    inv = _h0_inventory(lab, "prov.yml", testbed_project_dir=str(project), testbed_host_install_project=True,
                        testbed_host_torch_build="cpu", testbed_host_venv=str(tmp_path / "venv"),
                        testbed_host_torch_index_base="file:///nonexistent",
                        testbed_host_pip_extra_args="--no-index")  # fmt: skip
    tmp = tmp_path / "tmp"  # the run's temporary directories land here, not in /tmp, where another xdist worker's
    tmp.mkdir()  # provision run (tests/integration/test_lab.py) makes its own at the same time
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    before = set(tmp.glob("testbed-provision-*"))
    seen: dict[str, int] = {}
    done = threading.Event()

    def watch() -> None:  # records the mode of the run's private directory and archive while they exist
        while not done.is_set():
            for d in set(tmp.glob("testbed-provision-*")) - before:
                with contextlib.suppress(OSError):
                    seen.setdefault(str(d), stat.S_IMODE(os.lstat(d).st_mode))
                    a = d / "testbed-src.tar.gz"
                    seen.setdefault(str(a), stat.S_IMODE(os.lstat(a).st_mode))
            done.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    old_default = Path("/tmp/testbed-src.tar.gz")
    old_stat = old_default.stat().st_mtime_ns if old_default.exists() else None
    _ansible_env(lab, monkeypatch, tmp_path)
    try:
        with pytest.raises(ClusterError, match="ansible-playbook provision.yml failed"):
            LabCluster.from_inventory(inv).run_playbook("provision.yml", timeout_s=300)
    finally:
        done.set()
        watcher.join(10)
    assert sorted(x.name for x in project.iterdir()) == ["README.md", "pyproject.toml", "runners", "shaping", "testbed"]
    assert not list(project.rglob("__pycache__"))
    dirs = {k: v for k, v in seen.items() if not k.endswith(".tar.gz")}
    archives = {k: v for k, v in seen.items() if k.endswith(".tar.gz")}
    assert list(dirs.values()) == [0o700] and list(archives.values()) == [0o600], seen
    assert not any(Path(k).exists() for k in seen)  # removed after the run
    assert (old_default.stat().st_mtime_ns if old_default.exists() else None) == old_stat  # the fixed path unused


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs ansible-playbook in the venv (ansible-core)")
def test_accept_new_host_keys_refuses_a_changed_key_in_ansible(lab, tmp_path, monkeypatch):
    from testbed.cluster.lab.cluster import LabCluster
    from testbed.errors import ClusterError

    other = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    h = lab.hosts[0]
    forged = tmp_path / "known_hosts_forged"
    forged.write_text(f"{h.mgmt_addr} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    args = f"-o UserKnownHostsFile={forged} -o ConnectTimeout=10"
    _ansible_env(lab, monkeypatch, tmp_path)
    inv = _h0_inventory(lab, "forged.yml", ansible_ssh_common_args=args)
    with pytest.raises(ClusterError, match=r"teardown.yml failed.*(UNREACHABLE|Host key verification failed)"):
        LabCluster.from_inventory(inv, accept_new_host_keys=True).run_playbook("teardown.yml", timeout_s=120)
    # an unknown host is trusted on first use and recorded (accept-new), as by the SSH backend
    fresh = tmp_path / "known_hosts_empty"
    fresh.write_text("")
    inv = _h0_inventory(lab, "fresh.yml", ansible_ssh_common_args=f"-o UserKnownHostsFile={fresh}")
    LabCluster.from_inventory(inv, accept_new_host_keys=True).run_playbook("teardown.yml", timeout_s=120)
    assert h.host_key_pub.split()[1] in fresh.read_text()  # its real key (the host name may be hashed)
    assert forged.read_text().count("\n") == 1  # the forged entry was neither replaced nor joined by the real key
