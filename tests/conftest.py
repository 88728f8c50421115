"""Fixtures shared by every test directory.

- `root` marker: tests that create namespaces, veths or qdiscs. They are skipped, with the reason, when the run is not
  root or a tool they drive (`ip`, `tc`, `iperf3`, `ping`, `ss`) is missing.
- `state_dir` (session): a private TESTBED_STATE_DIR, so tests never read or write a user's /run/testbed.
- `cluster_name`: a unique cluster name ("t" + 6 random characters); whatever a test made under that name is torn
  down in the finalizer, even when the test failed.
- `testbed_cli` / `run_cli()`: the `testbed` command as a subprocess (`python -m testbed.cli ...`), with that env.
- `make_cluster`: `testbed up` through the CLI, registered for teardown.
- `scratch_netns`: namespaces a test makes by hand (prefix "tbt-"), deleted in teardown after killing what runs there.
- CPU per test: every run ends with the 15 tests that used the most CPU (the pytest process and the children it
  waited for: every CLI call, rank and playbook; a module fixture's daemons count where they are reaped) and the total,
  beside `--durations` (the suite is CPU-bound on 2 cores: this says where its time goes). The lines are kept in
  $TESTBED_TEST_CPU_LOG when set (JSON lines: test, cpu_s, wall_s), else in a temporary file removed at the end.
- Leak guard: a namespace of this run's making (a test cluster "tb-t??????-*", "tbt-*", the lab fixture's "tbl-*",
  named with a suffix this run drew: `random_suffix` keeps them in $TESTBED_TEST_NAMES) that is
  still there at the run's end fails the run, named; it is then removed (with what runs in it). Namespaces of another
  test session on the machine are never touched (their suffixes are not this run's).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("ip", "tc", "iperf3", "ping", "ss")
SCRATCH_PREFIX = "tbt-"  # namespaces tests make by hand; never "tb-" (clusters) nor "tbl-" (lab fixture)


# ---------------------------------------------------------------------------------------------- root marker
def root_skip_reason() -> str | None:
    """Why `root` tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (or CAP_NET_ADMIN): creates network namespaces, veths and qdiscs"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH (apt-get install iproute2 iperf3 iputils-ping)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is not None:
        reason = root_skip_reason()
        if reason:
            pytest.skip(reason)


# ---------------------------------------------------------------------------------------------- CPU per test, leak guard
CPU_LOG_ENV = "TESTBED_TEST_CPU_LOG"  # JSON lines: test, cpu_s, wall_s
NAMES_ENV = "TESTBED_TEST_NAMES"  # the name suffixes this run drew, a line each
_OWNED = pytest.StashKey[list]()  # the run's files the controller made (and removes at the end)


def _append_line(path: str, line: str) -> None:
    """One short line per write (O_APPEND): the xdist workers never interleave within a line."""
    with open(path, "a") as f:
        f.write(line + "\n")


def _cpu_s() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (recursively)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    """The controller (not an xdist worker) picks the CPU log and the names file, unless set; the workers inherit
    them through the environment."""
    if hasattr(config, "workerinput"):
        return
    config.stash[_OWNED] = []
    for env in (CPU_LOG_ENV, NAMES_ENV):
        if not os.environ.get(env):
            fd, os.environ[env] = tempfile.mkstemp(prefix=f"{env.lower()}-")
            os.close(fd)
            config.stash[_OWNED].append(os.environ[env])


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in config.stash.get(_OWNED, []):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    wall0, cpu0 = time.monotonic(), _cpu_s()
    yield
    path = os.environ.get(CPU_LOG_ENV)
    if path:
        line = {"test": item.nodeid, "cpu_s": round(_cpu_s() - cpu0, 2), "wall_s": round(time.monotonic() - wall0, 2)}
        _append_line(path, json.dumps(line))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    path = os.environ.get(CPU_LOG_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as log:
        rows = [json.loads(line) for line in log if line.strip()]
    if not rows:
        return
    total = sum(r["cpu_s"] for r in rows)
    terminalreporter.write_sep("=", "15 most CPU-hungry tests (pytest and its waited-for children, user+sys)")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:15]:
        terminalreporter.write_line(f"{r['cpu_s']:8.1f} CPU-s {r['wall_s']:8.1f} s wall  {r['test']}")
    terminalreporter.write_line(f"{total:8.1f} CPU-s in all, {len(rows)} tests")


TEST_NETNS = re.compile(r"^(tb-t[a-z0-9]{6}-|tbt-|tbl-)")


def namespaces_of_this_run() -> list[str]:
    """The namespaces of this machine named like a test's whose suffix this run drew (none when not root)."""
    path = os.environ.get(NAMES_ENV)
    if os.geteuid() != 0 or shutil.which("ip") is None or not path or not os.path.exists(path):
        return []
    with open(path) as f:
        drawn = {line.strip() for line in f if line.strip()}
    try:
        test_like = [n for n in netns_list() if TEST_NETNS.match(n)]
    except (OSError, subprocess.CalledProcessError):
        return []
    # the suffix is the second field: tb-<t + suffix>-h0, tbt-<suffix>, tbl-<suffix>-sw
    return sorted(n for n in test_like if {n.split("-")[1], n.split("-")[1][1:]} & drawn)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return
    left = namespaces_of_this_run()
    if not left:
        return
    for ns in left:  # what runs there was started by a test of this run
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "leak guard", red=True)
        reporter.write_line(f"the run left {len(left)} namespace(s) of its making (now removed): {', '.join(left)}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------------------------------------- helpers
def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.01):
    """Poll `predicate` until it returns something truthy (returned) or the deadline passes (AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)  # poll interval, bounded by the deadline above


def random_suffix(n: int = 6) -> str:
    """A random name suffix, remembered for the leak guard (the suite's test namespaces and clusters are named here)."""
    alphabet = string.ascii_lowercase + string.digits
    suffix = "".join(secrets.choice(alphabet) for _ in range(n))
    if os.environ.get(NAMES_ENV):
        _append_line(os.environ[NAMES_ENV], suffix)
    return suffix


def netns_list() -> list[str]:
    """Namespace names as `ip netns list` shows them (first word of each line)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())


def cluster_netns(name: str) -> list[str]:
    return [n for n in netns_list() if n.startswith(f"tb-{name}-")]


def pids_in_netns(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def kill_pids(pids: list[int]) -> None:
    """SIGKILL the given PIDs (only ever PIDs found in namespaces the tests made) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)], 5, "killed pids")


@contextlib.contextmanager
def ended_on_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """The block's process (a command the test signals), SIGKILLed and reaped on the way out if it still runs."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def one_line(stderr: str) -> str:
    """The single non-empty stderr line the CLI must print on error (asserts there is exactly one)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private TESTBED_STATE_DIR for the whole session, also set in os.environ for in-process calls."""
    path = tmp_path_factory.mktemp("testbed-state")
    old = os.environ.get("TESTBED_STATE_DIR")
    os.environ["TESTBED_STATE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TESTBED_STATE_DIR", None)
    else:
        os.environ["TESTBED_STATE_DIR"] = old


def cli_environment(state_dir: Path) -> dict[str, str]:
    """The environment of a `testbed` subprocess in the tests: this one, with the private state directory, no
    TESTBED_CLUSTER, the checkout importable and wide tables."""
    env = dict(os.environ)
    env["TESTBED_STATE_DIR"] = str(state_dir)
    env.pop("TESTBED_CLUSTER", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def cli_env(state_dir: Path) -> dict[str, str]:
    return cli_environment(state_dir)


def run_cli(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """`testbed ARGS...` as a subprocess; output captured as text, never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def testbed_cli(cli_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess]:
    """`testbed_cli("up", "--name", n, ...)` runs the CLI with the private state directory."""

    def call(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        return run_cli(cli_env, *args, timeout_s=timeout_s)

    return call


def _teardown_cluster(env: dict[str, str], name: str) -> None:
    """`testbed down`, then make sure: kill what still runs in its namespaces and delete them (only this name's)."""
    done = run_cli(env, "down", "--name", name, timeout_s=60)
    left = cluster_netns(name)
    for ns in left:
        kill_pids(pids_in_netns(ns))
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
    assert done.returncode == 0, f"teardown: testbed down --name {name} failed: {done.stderr.strip()}"
    assert not left, f"teardown: testbed down --name {name} left namespaces {left}"


@contextlib.contextmanager
def module_cluster(state_dir: Path, hosts: int = 2, bw: str = "1gbit"):
    """A cluster for a module-scoped fixture (the tests that leave it as they found it): `testbed up` under a fresh
    name with the session's state directory, yielded by name, torn down (`_teardown_cluster`) however left."""
    reason = root_skip_reason()
    if reason:
        pytest.skip(reason)
    env = cli_environment(state_dir)
    name = "t" + random_suffix()
    try:
        done = run_cli(env, "up", "--name", name, "--hosts", str(hosts), "--bw", bw)
        assert done.returncode == 0, done.stderr
        yield name
    finally:
        _teardown_cluster(env, name)


@pytest.fixture
def cluster_name(cli_env: dict[str, str]) -> str:
    """A unique cluster name; every namespace of that name is removed after the test, whatever happened."""
    name = "t" + random_suffix()
    yield name
    if os.geteuid() == 0:
        _teardown_cluster(cli_env, name)


@pytest.fixture
def make_cluster(cli_env: dict[str, str], testbed_cli) -> Callable[..., str]:
    """`make_cluster(hosts=2, "--bw", "100mbit")` runs `testbed up` under a fresh name and returns the name."""
    names: list[str] = []

    def make(hosts: int = 2, *flags: str) -> str:
        name = "t" + random_suffix()
        names.append(name)
        done = testbed_cli("up", "--name", name, "--hosts", str(hosts), *flags)
        assert done.returncode == 0, f"testbed up failed: {done.stderr.strip()}"
        return name

    yield make
    errors = []
    for name in names:
        try:
            _teardown_cluster(cli_env, name)
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "; ".join(errors)


@pytest.fixture
def scratch_netns() -> Callable[[], str]:
    """`ns = scratch_netns()` makes a namespace "tbt-XXXXXX" (lo up) that teardown deletes."""
    made: list[str] = []

    def make() -> str:
        name = SCRATCH_PREFIX + random_suffix()
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        made.append(name)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
        return name

    yield make
    for name in made:
        kill_pids(pids_in_netns(name))
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


_NETEM: dict[str, bool] = {}


def kernel_has_netem() -> bool:
    """Probe the running kernel once: can a netem qdisc be created (on lo of a throwaway namespace)?"""
    if "netem" not in _NETEM:
        name = SCRATCH_PREFIX + random_suffix()
        if root_skip_reason() or subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode:
            return False  # not root: nothing here can use netem anyway
        try:
            done = subprocess.run(
                ["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                capture_output=True,
                text=True,
                check=False,
            )
            _NETEM["netem"] = done.returncode == 0
        finally:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    return _NETEM["netem"]


NO_NETEM_REASON = "this kernel has no netem qdisc (sch_netem): `tc qdisc add ... netem` fails in a throwaway namespace"
