"""`testbed up --slurm` against a real Slurm (Debian's slurmctld, slurmd, munge) on namespaced hosts
(tests/integration/slurmhosts.py): the testbed_host role installs the Prolog/Epilog over SSH with ansible-playbook,
slurm.conf runs them; jobs are submitted with sbatch, ranks are srun steps, scancel ends everything. Needs root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from labhosts import PYTHON, REPO, pids_in_netns, wait_for
from slurmhosts import SlurmLab, create_slurm_lab, missing_binaries, new_name

from testbed.cluster.lab.inventory import DEFAULT_RUN_DIR

ANSIBLE_PLAYBOOK = Path(PYTHON).parent / "ansible-playbook"

pytestmark = [
    pytest.mark.root,
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces, veths, qdiscs"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server (/usr/sbin/sshd)"),
    pytest.mark.skipif(bool(missing_binaries()), reason=f"needs Slurm and munge (missing: {missing_binaries()}); "
                       "apt-get install slurmctld slurmd slurm-client munge"),  # fmt: skip
    pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs ansible-playbook in the venv"),
    pytest.mark.xdist_group("test_slurm"),  # the module's Slurm cluster on one xdist worker
]

FAULT_RUNNER = b"-m\x00tests.integration.fault_runner"  # a rank (not the controller: --runner-module NAME)
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


def _provision_role(sl: SlurmLab) -> tuple[Path, Path]:
    """The testbed_host role with testbed_slurm: true, over SSH to a namespaced host: it installs the shaping helper
    and the Prolog/Epilog that slurm.conf then names. One host (h0) is enough: the hosts share this machine's
    filesystem and the role writes the same paths on each (the role on 2 hosts is test_lab.py's provision run)."""
    lab = sl.lab
    etc = lab.tmp / "etc" / "slurm"
    prolog, epilog = etc / "testbed-prolog.sh", etc / "testbed-epilog.sh"
    inv = lab.write_inventory(
        "provision.yml", testbed_slurm=True, testbed_host_slurm_prolog=str(prolog), testbed_host_slurm_epilog=str(epilog)
    )
    res = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inv), str(REPO / "ansible" / "playbooks" / "provision.yml"), "--limit", "h0"],
        capture_output=True, text=True, env=lab.ansible_env(), timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    for script in (prolog, epilog):
        text = script.read_text()
        assert f"{lab.tmp / 'bin' / 'testbed-shaping'} clear --dev data0 --forget" in text, text
        assert os.access(script, os.X_OK)
    return prolog, epilog


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    sl = create_slurm_lab(tmp_path_factory.mktemp("slurm"), n_hosts=2, prepare=_provision_role)
    try:
        yield sl
    finally:
        problems = sl.teardown()
        assert not problems, problems


def _env(sl: SlurmLab, tmp: Path) -> dict[str, str]:
    return {**sl.env, "TESTBED_STATE_DIR": str(tmp / "state")}


def _cli(env: dict[str, str], *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "testbed.cli", *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout_s)  # fmt: skip


def _sbatch(sl: SlurmLab, tmp: Path, body: str, env: dict[str, str]) -> str:
    script = tmp / "job.sh"
    script.write_text("#!/bin/sh\nset -e\n" + textwrap.dedent(body))
    res = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "--exclusive", "-o", str(tmp / "job.out"), "-D", str(REPO), str(script)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _job_output(tmp: Path) -> str:
    p = tmp / "job.out"
    return p.read_text()[-4000:] if p.exists() else "(no job output)"


def _qdiscs(sl: SlurmLab, h) -> str:
    return sl.lab.netns_exec(h, "tc", "qdisc", "show", "dev", "data0").stdout


def _ranks(sl: SlurmLab, module: bytes = b"runners.train") -> dict[str, list[int]]:
    """Rank processes (of the runner `module`) in each host's namespace."""
    return {h.name: _processes(sl, module, h) for h in sl.lab.hosts}


def _processes(sl: SlurmLab, needle: bytes, host=None) -> list[int]:
    """Processes in the hosts' namespaces (or one host's) whose command line holds `needle`."""
    pids = []
    for h in [host] if host else sl.lab.hosts:
        for pid in pids_in_netns(sl.lab.inodes[h.ns]):
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(pid)
    return pids


def test_slurm_bad_input_is_one_line_and_changes_nothing(slurm, tmp_path):
    env = _env(slurm, tmp_path)
    env.pop("SLURM_JOB_ID", None)
    res = _cli(env, "up", "--slurm", "--iface", "data0", "--name", "tbx")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--slurm: not inside a Slurm allocation (SLURM_JOB_ID unset); run it under salloc or sbatch" in res.stderr
    nodes = list(slurm.nodes.values())
    fake = {**env, "SLURM_JOB_ID": "999999", "SLURM_JOB_NODELIST": ",".join(nodes)}
    for argv, msg in (
        (["--slurm", "--hosts", "3", "--iface", "data0"], "--hosts do not apply"),
        (["--slurm"], "--slurm needs the data interface"),
        (["--iface", "data0"], "--iface names the data NIC of Slurm nodes: it needs --slurm"),
        (["--slurm", "--inventory", str(slurm.lab.write_inventory("names.yml"))],
         f"the allocation's nodes {', '.join(nodes)} are not in it"),
        (["--slurm", "--iface", "data0"], "its Slurm job 999999 has ended"),  # not a running job: nothing recorded
    ):  # fmt: skip
        res = _cli(fake, "up", "--name", "tbx", *argv)
        assert res.returncode in (1, 2) and msg in res.stderr, (argv, res.stderr)
        assert res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "state" / "clusters" / "tbx.json").exists()


def test_sbatch_up_slurm_and_two_host_run(slurm, tmp_path):
    """In an sbatch job on 2 nodes: `up --slurm --iface data0`, a 2-host shaped `testbed run`, `status`, `down`."""
    name = new_name()
    env = _env(slurm, tmp_path)
    res_dir = tmp_path / "results"
    job = _sbatch(slurm, tmp_path, f"""
        {PYTHON} -m testbed.cli up --slurm --iface data0 --name {name} --json > {tmp_path / 'up.json'}
        {PYTHON} -m testbed.cli run --name {name} --model mlp --iters 3 --warmup-iters 1 --batch-size 8 \\
            --bw 200mbit --world-size 2 --out {res_dir} --timeout 200
        {PYTHON} -m testbed.cli status --name {name} --json > {tmp_path / 'status.json'}
        {PYTHON} -m testbed.cli down --name {name}
        """, env)  # fmt: skip
    try:
        state = wait_for(lambda: (s := slurm.job_state(job)) in END_STATES and s, 400, f"job {job} to end", 0.5)
    finally:
        leftover = sorted(Path(DEFAULT_RUN_DIR).glob(f"tb-{name}.*"))  # the attempt's private dir (no inventory)
        for d in leftover:
            shutil.rmtree(d, ignore_errors=True)
    out = _job_output(tmp_path)
    assert state == "COMPLETED", out
    assert not leftover  # fetched, then removed from the node
    up = json.loads((tmp_path / "up.json").read_text())
    assert up["backend"] == "slurm" and up["slurm_job"] == job
    assert [h["name"] for h in up["hosts"]] == list(slurm.nodes.values())
    assert [h["address"] for h in up["hosts"]] == [h.data_addr for h in slurm.lab.hosts]
    assert all(h["data_iface"] == "data0" and h["slurm"] == f"job {job} node {h['name']}" for h in up["hosts"])
    assert "200mbit / " in out and "2 ranks" in out, out  # the trial's probe went through srun steps too
    rows = json.loads(_cli(env, "results", str(res_dir), "--json").stdout)
    assert [(r["status"], r["host_count"], r["world_size"], r["backend"]) for r in rows] == [("ok", 2, 2, "slurm")]
    status = json.loads((tmp_path / "status.json").read_text())
    assert all(not h["links"]["upload"].get("owned") for h in status["hosts"])  # the trial's shaping was undone
    assert "shaping cleared on 2 nodes" in out, out  # `down` inside the job
    assert not (tmp_path / "state" / "clusters" / f"{name}.json").exists()
    for h in slurm.lab.hosts:
        assert "7e57" not in _qdiscs(slurm, h)
    assert _ranks(slurm) == {h.name: [] for h in slurm.lab.hosts}


def test_scancel_mid_trial_leaves_no_shaping_and_no_rank(slurm, tmp_path):
    """A trial that never ends (nodes from an inventory: the role's helper runs directly as root): once ranks run and
    both data NICs are shaped, the controller is killed (cleans up nothing) and the job scancelled: Slurm ends the
    ranks, the Epilog clears the shaping, the job is CANCELLED, the nodes idle; afterwards the cluster fails with one
    line and `down` forgets it. The ranks are the fault runner's hanging stand-ins (ending them is Slurm's part; a
    training rank would burn both cores until the scancel): real training over Slurm is the test above."""
    name = new_name()
    env = _env(slurm, tmp_path)
    inv = slurm.lab.inventory()
    hosts = inv["all"]["children"]["testbed"]["hosts"]
    inv["all"]["children"]["testbed"]["hosts"] = {slurm.nodes[h]: v for h, v in hosts.items()}
    inv_path = slurm.lab.write_inventory("slurm-inventory.yml", inventory=inv)
    job = _sbatch(slurm, tmp_path, f"""
        {PYTHON} -m testbed.cli up --slurm --inventory {inv_path} --name {name}
        {PYTHON} -m testbed.cli run --name {name} --model mlp --iters 1 --bw 100mbit --world-size 2 --no-probe \\
            --runner-module tests.integration.fault_runner --env TESTBED_FAULT=hang --out {tmp_path / 'results'} \\
            --timeout 600 || true
        exec sleep 3600  # the allocation outlives its controller, like an salloc shell
        """, env)  # fmt: skip

    def running_and_shaped() -> bool:
        if slurm.job_state(job) in END_STATES:
            raise AssertionError(f"job {job} ended early: {_job_output(tmp_path)}")
        ranks = _ranks(slurm, FAULT_RUNNER)
        return all(ranks.values()) and all("qdisc htb 7e57: root" in _qdiscs(slurm, h) for h in slurm.lab.hosts)

    wait_for(running_and_shaped, 240, "ranks running and shaping applied on both nodes", 0.5)
    for h in slurm.lab.hosts:
        assert "ifb-data0" in slurm.lab.netns_exec(h, "ip", "link").stdout
    # the worst case: the controller (`testbed run` in the batch step) dies first and cleans up nothing, so what
    # follows is Slurm's doing (ending the steps) and the Epilog's (clearing the shaping)
    controller = _processes(slurm, b"testbed.cli\x00run")
    assert len(controller) == 1, controller
    os.kill(controller[0], signal.SIGKILL)
    wait_for(lambda: not _processes(slurm, b"testbed.cli\x00run"), 10, "the controller to die")
    assert all(_ranks(slurm, FAULT_RUNNER).values()) and all("7e57" in _qdiscs(slurm, h) for h in slurm.lab.hosts)
    res = slurm.slurm("scancel", job)
    assert res.returncode == 0, res.stderr

    seen: dict = {}

    def settled() -> bool:
        seen.update(state=slurm.job_state(job), ranks=_ranks(slurm, FAULT_RUNNER),
                    qdiscs=[_qdiscs(slurm, h) for h in slurm.lab.hosts])
        return seen["state"] == "CANCELLED" and not any(seen["ranks"].values()) and "7e57" not in str(seen["qdiscs"])

    try:
        wait_for(settled, 60, "the job cancelled, its ranks gone and the Epilog's clearing", 0.5)
    except AssertionError as e:
        logs = {f.name: f.read_text()[-1500:] for f in sorted((slurm.conf.parent).glob("slurmd-*.log"))}
        raise AssertionError(f"{e}: {seen}; {logs}") from None
    # the Epilog succeeded on both nodes (a failing one drains the node)
    wait_for(lambda: set(slurm.node_states().values()) == {"idle"}, 60, "both nodes idle again", 0.5)
    for h in slurm.lab.hosts:
        assert "ingress" not in _qdiscs(slurm, h)
        assert "ifb-data0" not in slurm.lab.netns_exec(h, "ip", "link").stdout
        assert not Path(f"/run/testbed-shaping/netns-{slurm.lab.inodes[h.ns]}").exists()  # --forget: no timer, no state
    # the record outlives the job: using it says so in one line; down forgets it
    st = _cli(env, "status", "--name", name)
    assert st.returncode == 1 and st.stderr.count("\n") == 1, st.stderr
    assert f"its Slurm job {job} has ended" in st.stderr and f"testbed down --name {name}" in st.stderr
    down = _cli(env, "down", "--name", name)
    assert down.returncode == 0 and f"Slurm job {job} has ended" in down.stdout, down.stdout + down.stderr
    assert not (tmp_path / "state" / "clusters" / f"{name}.json").exists()

