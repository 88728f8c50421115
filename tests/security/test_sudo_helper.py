"""The sudo rule for the shaping helper, attacked by the user who holds it.

A real sudo rule, rendered from the testbed_host role's template for the throwaway user and checked with `visudo -cf`,
sits in /etc/sudoers.d/ for this module and is removed after it. The helper (the role's template too) is pinned to the
data NIC `data0`, a dummy interface in a namespace of this module; the user runs `sudo -n <helper> ...` inside that
namespace. Each attack below worked before the fix (issue 29): root killed a pid the user named, truncated a root file
through a planted `.lock` link, appended to one through a planted timer-log link, and read records the user wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from tests.conftest import REPO, random_suffix, wait_for

pytestmark = [
    pytest.mark.root,
    pytest.mark.xdist_group("test_sudo_helper"),  # one module fixture (a sudo rule and a namespace) per run
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: installs a sudo rule and makes a namespace"),
    pytest.mark.skipif(
        shutil.which("sudo") is None or shutil.which("visudo") is None,
        reason="needs sudo and visudo (Debian package sudo, in the Makefile's SYSTEM_PACKAGES)",
    ),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]

TEMPLATES = REPO / "ansible" / "roles" / "testbed_host" / "templates"
DATA_NIC = "data0"
VICTIM_TEXT = "root's own file: the attacker must not change it\n"


def render(name: str, **vars_) -> str:
    """A template of the testbed_host role, rendered as Ansible's template module does (trim_blocks, `quote`)."""
    import shlex

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.get_template(name).render(**vars_)


class Sandbox:
    """The namespace with the data NIC, the helper, the sudo rule, and a way to act as the user inside."""

    def __init__(self, user, root_dir: Path):
        self.user = user
        self.ns = "tbt-sudo" + random_suffix(5)
        self.root_dir = root_dir  # root's, mode 0700: the user cannot read or write anything in it
        self.helper = root_dir / "bin" / "testbed-shaping"
        self.sudoers = Path("/etc/sudoers.d") / f"testbed-test-{user.name}"
        self.inode = 0

    def setup(self) -> None:
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self.inode = os.stat(f"/run/netns/{self.ns}").st_ino
        subprocess.run(["ip", "-n", self.ns, "link", "add", DATA_NIC, "type", "veth", "peer", "name", "peer0"],
                       check=True)  # fmt: skip (no dummy module on every kernel; veth is there)
        subprocess.run(["ip", "-n", self.ns, "link", "set", DATA_NIC, "up"], check=True)
        self.helper.parent.mkdir(parents=True)
        self.helper.write_text(render("testbed-shaping.sh.j2", testbed_host_python=sys.executable,
                                      testbed_host_project_dir=str(REPO), testbed_host_data_iface=DATA_NIC))  # fmt: skip
        self.helper.chmod(0o755)
        rule = render("testbed-shaping.sudoers.j2", testbed_host_shaping_sudo_users=[self.user.name],
                      testbed_host_shaping_helper=str(self.helper))  # fmt: skip
        candidate = self.root_dir / "sudoers"
        candidate.write_text(rule)
        checked = subprocess.run(["visudo", "-cf", str(candidate)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        fd = os.open(self.sudoers, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o440)
        with os.fdopen(fd, "w") as fh:
            fh.write(rule)

    def teardown(self) -> list[str]:
        problems = []
        self.sudoers.unlink(missing_ok=True)
        if os.path.exists(f"/run/netns/{self.ns}"):
            done = self.as_root("clear", "--dev", DATA_NIC, "--forget")
            if done.returncode != 0:
                problems.append(f"clear --forget: {done.stderr.strip()}")
            subprocess.run(["ip", "netns", "del", self.ns], check=False)
        state = Path("/run/testbed-shaping") / f"netns-{self.inode}"
        if state.exists():
            problems.append(f"{state} left behind: {sorted(p.name for p in state.iterdir())}")
            shutil.rmtree(state, ignore_errors=True)
        return problems

    def sudo(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`sudo -n <helper> ARGS` as the user, inside the namespace."""
        return self.as_user("sudo", "-n", str(self.helper), *args, env=env)

    def as_user(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.user.home), "USER": self.user.name}
        drop = ["setpriv", f"--reuid={self.user.uid}", f"--regid={self.user.gid}", "--clear-groups", "--"]
        return subprocess.run(["ip", "netns", "exec", self.ns, *drop, *argv], env={**base, **(env or {})},
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    def as_root(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-m", "shaping", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    def qdiscs(self) -> str:
        return subprocess.run(["tc", "-n", self.ns, "qdisc", "show", "dev", DATA_NIC], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip

    # ------------------------------------------------------------------------------------ what the user can plant
    def plant(self, relative: str, *, text: str | None = None, link_to: Path | None = None) -> Path:
        """A file or symbolic link under the user's home, owned by the user, as the user would make it."""
        path = self.user.home / relative
        for parent in reversed([p for p in path.parents if self.user.home in p.parents]):
            if not parent.exists():
                parent.mkdir(mode=0o755)
                os.chown(parent, self.user.uid, self.user.gid)
        if link_to is not None:
            os.symlink(link_to, path)
        else:
            path.write_text(text or "")
        os.lchown(path, self.user.uid, self.user.gid)
        return path

    def state_dir(self, base: Path) -> Path:
        """Where the old code put this namespace's records under a --state-dir BASE."""
        return base / f"netns-{self.inode}"


@pytest.fixture(scope="module")
def box(unprivileged_user, tmp_path_factory):
    root_dir = tmp_path_factory.mktemp("sudo-helper")
    os.chmod(root_dir, 0o700)
    sandbox = Sandbox(unprivileged_user, root_dir)
    try:
        sandbox.setup()
        yield sandbox
    finally:
        problems = sandbox.teardown()
        assert not problems, problems


@pytest.fixture
def victim(box):
    """A root-owned file the user cannot read or write (in root's 0700 directory), with known contents."""
    path = box.root_dir / f"victim-{random_suffix(4)}"
    path.write_text(VICTIM_TEXT)
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def bystander():
    """A process of the test that the attacker would like root to kill."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _one_line_exit_2(done: subprocess.CompletedProcess, why: str) -> None:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and why in lines[0], done.stderr


def test_the_rule_shapes_the_data_nic_and_confirms(box):
    """The positive control: through the rule, apply with a commit-confirm timer, show it pending, confirm (which
    must recognise and end the real timer), clear. The timer runs as root with python -I and a bare environment."""
    applied = box.sudo("apply", "--dev", DATA_NIC, "--bw", "10mbit", "--confirm-within", "600", "--json")
    assert applied.returncode == 0, applied.stderr
    pid = json.loads(applied.stdout)["confirm"]["timer_pid"]
    assert "qdisc htb 7e57: root" in box.qdiscs()
    wait_for(lambda: b"--timer" in Path(f"/proc/{pid}/cmdline").read_bytes(), 10, "the timer to exec")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1] == b"-I"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [e for e in environ if e.startswith((b"PYTHON", b"SUDO_", b"HOME=", b"TESTBED"))], environ
    state = Path("/run/testbed-shaping") / f"netns-{box.inode}"
    st = os.lstat(state)
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o700
    shown = box.sudo("show", "--dev", DATA_NIC, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["pending"]["status"] == "pending", shown.stderr
    confirmed = box.sudo("confirm", "--dev", DATA_NIC, "--json")
    assert confirmed.returncode == 0 and json.loads(confirmed.stdout)["confirmed"], confirmed.stderr
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or b"Z" in _proc_state(pid), 10, "the timer to end")
    cleared = box.sudo("clear", "--dev", DATA_NIC, "--json")
    assert cleared.returncode == 0 and "7e57" not in box.qdiscs(), cleared.stderr


def _proc_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"


def test_a_forged_record_cannot_make_root_kill_a_process(box, bystander):
    """A pending record the user wrote, naming the bystander's pid with an empty token (which matched any command
    line): reached through `--dev ../..`, `--state-dir` or the environment, root must neither signal the pid nor
    delete the user's file."""
    forged = json.dumps({"dev": DATA_NIC, "status": "pending", "token": "", "timer_pid": bystander.pid,
                         "previous": {}, "applied": {}})  # fmt: skip
    traversal = box.plant("x/y.pending.json", text=forged)
    in_state_dir = box.plant(f"sd/netns-{box.inode}/{DATA_NIC}.pending.json", text=forged)
    dev = "../../../.." + str(traversal.with_name("y"))
    for done, why in (
        (box.sudo("confirm", "--dev", dev), "not an interface name"),
        (box.sudo("rollback", "--dev", dev), "not an interface name"),
        (box.sudo("clear", "--dev", dev), "not an interface name"),
        (box.sudo("confirm", "--dev", DATA_NIC, "--state-dir", str(box.user.home / "sd")), "--state-dir"),
        (box.sudo("clear", "--dev", DATA_NIC, "--forget", "--state-dir", str(box.user.home / "sd")), "--state-dir"),
    ):
        _one_line_exit_2(done, why)
    through_env = box.sudo("confirm", "--dev", DATA_NIC, env={"TESTBED_SHAPING_STATE_DIR": str(box.user.home / "sd")})
    assert through_env.returncode == 0, through_env.stderr  # env_reset: the variable never reaches the helper
    set_on_line = box.as_user("sudo", "-n", f"TESTBED_SHAPING_STATE_DIR={box.user.home / 'sd'}", str(box.helper),
                              "confirm", "--dev", DATA_NIC)  # fmt: skip
    assert set_on_line.returncode != 0  # !setenv: sudo itself refuses VAR=value
    assert bystander.poll() is None, "root killed the process the forged record named"
    assert traversal.read_text() == forged and in_state_dir.read_text() == forged


def test_a_planted_lock_link_cannot_truncate_a_root_file(box, victim):
    """`.lock` was opened with "w" (O_TRUNC) through whatever link sat there."""
    sd = box.user.home / f"lock-{random_suffix(4)}"
    box.plant(f"{sd.name}/netns-{box.inode}/.lock", link_to=victim)
    for sub in ("confirm", "rollback", "show"):
        _one_line_exit_2(box.sudo(sub, "--dev", DATA_NIC, "--state-dir", str(sd)), "--state-dir")
    assert victim.read_text() == VICTIM_TEXT
    assert victim.stat().st_uid == 0


def test_a_planted_log_link_cannot_append_to_a_root_file(box, victim):
    """The timer log was opened for append through a planted link, and the timer wrote the record's `dev` into it."""
    sd = box.user.home / f"log-{random_suffix(4)}"
    box.plant(f"{sd.name}/netns-{box.inode}/{DATA_NIC}.timer.log", link_to=victim)
    done = box.sudo("apply", "--dev", DATA_NIC, "--bw", "10mbit", "--confirm-within", "1", "--state-dir", str(sd))
    _one_line_exit_2(done, "--state-dir")
    assert "7e57" not in box.qdiscs()  # refused before anything changed: no shaping, hence no timer
    assert victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["show", "--dev", "lo"], "only the host's data NIC (data0)"),
        (["apply", "--dev", "lo", "--bw", "10mbit"], "only the host's data NIC (data0)"),
        (["show", "--dev", "../../../../etc/passwd"], "not an interface name"),
        (["show", "--dev", "data0\nforged log line"], "not an interface name"),
        (["show", "--dev", DATA_NIC, "--netns", "tbt-other"], "--netns tbt-other: not accepted through sudo"),
        (["show", "--dev", DATA_NIC, "--netns", "/proc/1/ns/net"], "not a namespace name"),
        (["apply", "--dev", DATA_NIC, "--bw", "10mbit", "--mgmt-addr", "notanip"], "--mgmt-addr 'notanip'"),
    ],
)
def test_arguments_beyond_the_data_nic_are_refused(box, args, why):
    _one_line_exit_2(box.sudo(*args), why)
    assert "7e57" not in box.qdiscs()


def test_only_the_shaping_subcommands_are_allowed(box):
    """kernel-check (a subprocess in a private namespace) and anything else are not in the rule: sudo refuses."""
    for args in (["kernel-check"], ["--debug", "show", "--dev", DATA_NIC], []):
        done = box.sudo(*args)
        assert done.returncode == 1 and "sudo" in done.stderr, (args, done.stderr)
