"""The helper's code on a lab host belongs to root and nobody else can write it.

The testbed_host role unpacked the controller's checkout as root with the archive's owner and modes, so the directory
the root-owned helper imports from belonged to the controller's uid with mode 775: whoever had that uid edited code
that runs as root. These tests run the role's own task files (project_source.yml, shaping_helper.yml) with
`ansible-playbook -c local` on this machine (the namespaced lab hosts share its filesystem, so it is the same check):
an archive made by the throwaway user, files 775, is unpacked root's and not group/world-writable, and the role's
assertion refuses a tree someone else could change (before the helper is installed).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: unpacks files as root and chowns them"),
    pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs ansible-playbook in the venv (ansible-core)"),
]


def _playbook(tmp: Path, task_files: list[str], env_extra: dict[str, str] | None = None, **vars_) -> subprocess.CompletedProcess:
    book = tmp / "play.yml"
    tasks = [{"ansible.builtin.include_role": {"name": "testbed_host", "tasks_from": f}} for f in task_files]
    book.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    extra = tmp / "vars.json"
    extra.write_text(json.dumps({"ansible_python_interpreter": sys.executable, "testbed_data_iface": "data0",
                                 "testbed_host_shaping_sudo_users": [], **vars_}))  # fmt: skip
    home = tmp / "ansible-home"
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(REPO / "ansible" / "roles"), "ANSIBLE_HOME": str(home),
           "ANSIBLE_LOCAL_TEMP": str(home / "tmp"), "ANSIBLE_REMOTE_TEMP": str(home / "remote"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", **(env_extra or {})}  # fmt: skip
    argv = [str(ANSIBLE_PLAYBOOK), "-c", "local", "-i", "localhost,", str(book), "-e", f"@{extra}"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def _not_roots(tree: Path) -> list[str]:
    """Paths under `tree` (itself included) that are not root's or are group/world-writable."""
    bad = []
    for path in [tree, *tree.rglob("*")]:
        st = os.lstat(path)
        if st.st_uid != 0 or st.st_gid != 0 or (not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022):
            bad.append(f"{path} uid={st.st_uid} mode={stat.S_IMODE(st.st_mode):o}")
    return bad


@pytest.fixture
def private_tmp(tmp_path):
    os.chmod(tmp_path, 0o700)
    return tmp_path


def test_the_role_unpacks_the_checkout_as_roots_files(unprivileged_user, private_tmp):
    """The controller's checkout belongs to the user, every file and directory mode 775."""
    src = private_tmp / "checkout"
    shutil.copytree(REPO / "shaping", src / "shaping", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    for path in [src, *src.rglob("*")]:
        os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
        os.chmod(path, 0o775)
    (src / "results").mkdir()
    (src / "results" / "token.txt").write_text("not a package file")  # beside the packages: never shipped
    dest = private_tmp / "opt" / "src"
    dest.parent.mkdir(mode=0o755)
    helper = private_tmp / "bin" / "testbed-shaping"
    controller_tmp = private_tmp / "controller-tmp"  # the role run by hand (no archive named): its private pack dir
    controller_tmp.mkdir()
    done = _playbook(private_tmp, ["project_source.yml", "shaping_helper.yml"], {"TMPDIR": str(controller_tmp)},
                     testbed_host_source_dir=str(src), testbed_host_source_members=["pyproject.toml", "shaping"],
                     testbed_host_project_dir=str(dest),
                     testbed_host_python=sys.executable, testbed_shaping_helper=str(helper),
                     testbed_host_shaping_sudoers_path=str(private_tmp / "sudoers"))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (dest / "shaping" / "commit_confirm.py").is_file()
    assert sorted(p.name for p in dest.iterdir()) == ["pyproject.toml", "shaping"]  # the package files only
    assert list(controller_tmp.iterdir()) == [], "the private archive directory was left behind"
    assert _not_roots(dest) == []
    st = os.stat(helper)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755


def test_the_role_refuses_a_tree_others_can_change(unprivileged_user, private_tmp):
    """A project directory with a group-writable file and a directory of the user fails the role's assertion, which
    names both, and no helper is installed."""
    tree = private_tmp / "src"
    shutil.copytree(REPO / "shaping", tree / "shaping", ignore=shutil.ignore_patterns("__pycache__"))
    writable = tree / "shaping" / "tc.py"
    os.chmod(writable, 0o664)
    theirs = tree / "plugins"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, unprivileged_user.uid, unprivileged_user.gid)
    helper = private_tmp / "bin" / "testbed-shaping"
    done = _playbook(private_tmp, ["shaping_helper.yml"], testbed_host_project_dir=str(tree),
                     testbed_host_python=sys.executable, testbed_shaping_helper=str(helper),
                     testbed_host_shaping_sudoers_path=str(private_tmp / "sudoers"))  # fmt: skip
    assert done.returncode != 0
    assert "anyone but root" in done.stdout and "Whoever can write them gets root" in done.stdout, done.stdout[-3000:]
    assert str(writable) in done.stdout and str(theirs) in done.stdout, done.stdout[-3000:]
    assert not helper.exists()
