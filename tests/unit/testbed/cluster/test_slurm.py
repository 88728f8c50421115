"""The Slurm backend without a Slurm: refusals before anything runs, step command lines, the record round trip,
shaping through sudo for a normal user, the role's Prolog/Epilog. (tests/integration/test_slurm.py runs a real one.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import jinja2
import pytest

from testbed import cli
from testbed.cluster import slurm
from testbed.cluster.base import Cluster
from testbed.cluster.lab.inventory import LabHostSpec
from testbed.cluster.slurm import NOT_IN_ALLOCATION, SlurmCluster, SrunConnection, _clean_stderr
from testbed.cluster.ssh import SSHTarget
from testbed.errors import InputError

REPO = Path(__file__).resolve().parents[4]


def _cluster(become: bool = False, helper_named: bool = False) -> SlurmCluster:
    specs = [
        LabHostSpec(n, SSHTarget(n, n), "data0", f"192.0.2.{i + 1}", 0, "/venv/bin/python", "/src", "/tmp/run",
                    become=become)  # fmt: skip
        for i, n in enumerate(("n1", "n2"))
    ]
    return SlurmCluster("sx", specs, job_id="77", helper_named=helper_named)


def test_outside_an_allocation_is_refused_in_one_line():
    with pytest.raises(InputError) as e:
        SlurmCluster.from_allocation("sx", iface="data0", environ={})
    assert str(e.value) == NOT_IN_ALLOCATION
    assert str(e.value) == (
        "--slurm: not inside a Slurm allocation (SLURM_JOB_ID unset); run it under salloc or sbatch"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--slurm", "--hosts", "3"], "--hosts do not apply"),
        (["up", "--slurm", "--gpus", "all", "--recreate"], "--recreate, --gpus do not apply"),
        (["up", "--iface", "eth1"], "--iface names the data NIC of Slurm nodes: it needs --slurm"),
    ],
)
def test_cli_refuses_flags_that_do_not_apply(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "clusters").exists()  # nothing recorded


def test_step_command_line_is_one_task_on_one_node_of_the_job(monkeypatch):
    monkeypatch.setattr(slurm, "_tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("HOME", "/home/alice")
    argv = SrunConnection(_cluster(), "n2").srun_argv("tb-sx-abcd")
    assert argv[:10] == ["/usr/bin/srun", "--jobid", "77", "--overlap", "--nodes", "1", "--ntasks", "1", "-w", "n2"]
    assert "--job-name" in argv and argv[argv.index("--job-name") + 1] == "tb-sx-abcd"
    assert argv[-1].startswith("--export=PATH=") and argv[-1].endswith(",HOME=/home/alice")  # not the whole env


def test_client_env_drops_the_allocations_task_layout(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/x.conf")
    env = slurm.client_env()
    assert "SLURM_NTASKS_PER_NODE" not in env and env["SLURM_CONF"] == "/etc/slurm/x.conf"


def test_srun_lines_are_dropped_when_the_task_spoke():
    assert _clean_stderr("error: bad rate\nsrun: error: n1: task 0: Exited with exit code 2\n") == "error: bad rate\n"
    only = "srun: error: Unable to confirm allocation for job 77: Invalid job id specified\n"
    assert _clean_stderr(only) == only


def test_shaping_goes_through_sudo_for_a_user_and_the_helper_for_root():
    assert _cluster(become=True)._shaping_argv(_cluster(become=True).specs["n1"], "clear", "--dev", "data0")[:3] == [
        "sudo", "-n", "/usr/local/sbin/testbed-shaping"]  # fmt: skip
    root_inv = _cluster(helper_named=True)
    assert root_inv._shaping_argv(root_inv.specs["n1"], "show")[:1] == ["/usr/local/sbin/testbed-shaping"]
    root = _cluster()
    assert root._shaping_argv(root.specs["n1"], "show") == ["/venv/bin/python", "-m", "shaping", "show"]


def test_record_round_trip_and_interface():
    c = _cluster(become=True)
    assert isinstance(c, Cluster) and c.backend == "slurm" and c.command_prefix(c.host("n1")) is None
    rec = c.to_record()
    assert rec["backend"] == "slurm" and rec["job_id"] == "77"
    assert rec["hosts"] == [{"name": "n1", "data_iface": "data0"}, {"name": "n2", "data_iface": "data0"}]
    back = SlurmCluster.from_record(rec)
    assert [(s.name, s.data_iface, s.become, s.python) for s in back.specs.values()] == [
        ("n1", "data0", True, "/venv/bin/python"), ("n2", "data0", True, "/venv/bin/python")]  # fmt: skip
    assert [h.address for h in back.hosts()] == ["192.0.2.1", "192.0.2.2"]


def test_an_ended_job_is_one_line_and_down_forgets_it(monkeypatch, tmp_path):
    from testbed.cluster import registry
    from testbed.errors import ClusterError

    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(slurm, "job_state", lambda job: (None, "slurm_load_jobs error: Invalid job id specified"))
    c = _cluster()
    c.record = c.to_record()
    registry.save_record("sx", c.record)
    with pytest.raises(ClusterError, match=r"its Slurm job 77 has ended .*`testbed down --name sx` forgets it"):
        c.run("n1", ["true"])
    assert "record removed" in c.down()
    assert registry.load_record("sx") is None


@pytest.mark.parametrize("script", ["Prolog", "Epilog"])
def test_role_prolog_and_epilog_clear_the_data_nic(script, tmp_path):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "ansible/roles/testbed_host/templates"))
    env.filters["quote"] = lambda s: "'" + str(s).replace("'", "'\\''") + "'"
    helper = tmp_path / "testbed-shaping"
    helper.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n")
    helper.chmod(0o755)
    text = env.get_template("testbed-slurm-clear.sh.j2").render(
        testbed_host_shaping_helper=str(helper), testbed_host_data_iface="ens1f0", testbed_host_slurm_script=script,
        testbed_host_slurm_path=f"/etc/slurm/testbed-{script.lower()}.sh",
    )  # fmt: skip
    assert f"{script}=/etc/slurm/testbed-{script.lower()}.sh" in text
    path = tmp_path / "s.sh"
    path.write_text(text)
    res = subprocess.run(["sh", str(path)], env={}, capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "calls").read_text() == "clear --dev ens1f0 --forget\n"
    helper.write_text("#!/bin/sh\nexit 3\n")  # a clear that fails: non-zero, so Slurm drains the node
    assert subprocess.run(["sh", str(path)], env={}, capture_output=True, timeout=10).returncode == 3


def test_a_ranks_variables_reach_the_step_by_name_never_on_the_command_line(monkeypatch, tmp_path):
    """`testbed run --env TOKEN=...` under Slurm: srun's command line (readable by every user of the machine) names
    the variable; its value is only in srun's environment, which --export passes on to the step."""
    monkeypatch.setattr(slurm, "_tool", lambda name: f"/usr/bin/{name}")
    c = _cluster()
    monkeypatch.setattr(c, "require_allocation", lambda: None)
    seen = {}

    class FakePopen:
        def __init__(self, argv, **kw):
            seen["argv"], seen["env"] = argv, kw["env"]
            self.pid = 4242

    monkeypatch.setattr(slurm.subprocess, "Popen", FakePopen)
    c.start("n1", ["python", "-m", "runners.train"], env={"RANK": "0", "API_TOKEN": "s3cret-value"},
            log_path=tmp_path / "r0.log")  # fmt: skip
    assert not any("s3cret-value" in a for a in seen["argv"])
    export = next(a for a in seen["argv"] if a.startswith("--export="))
    assert export.endswith(",RANK,API_TOKEN")
    assert seen["env"]["API_TOKEN"] == "s3cret-value" and seen["env"]["RANK"] == "0"
    with pytest.raises(InputError, match="not valid"):
        c.start("n1", ["true"], env={"BAD-NAME": "x"}, log_path=tmp_path / "r1.log")
