"""The launch plan: placement, backend resolution, device mapping, NCCL settings, the environment allowlist, refusals.

GPUs cannot exist here, so hosts are described with the GPU indices a real cluster would report; everything the
plan derives from them (CUDA_VISIBLE_DEVICES, NCCL_HOSTID, LOCAL_RANK, argv) is checked as it would be started.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from runners.contract import RankArgs, RankEnv
from testbed.cluster.base import Host
from testbed.cluster.local import assign_gpus
from testbed.config import Trial
from testbed.errors import InputError
from testbed.gpus import parse_gpus_flag
from testbed.launch_plan import plan, resolve

SECRET = {"GITHUB_TOKEN": "ghp_secret", "AWS_SECRET_ACCESS_KEY": "x", "PATH": "/controller/bin", "HOME": "/root",
          "LD_LIBRARY_PATH": "/controller/lib", "CUDA_VISIBLE_DEVICES": "7", "NCCL_DEBUG": "INFO",
          "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "OMP_NUM_THREADS": "3"}  # fmt: skip


def cpu_hosts(n: int, emulated: bool = True) -> list[Host]:
    return [Host(f"h{i}", f"10.77.0.{i + 1}", "eth0", f"tb-x-h{i}", emulated=emulated) for i in range(n)]


def gpu_hosts(n: int, per_host: int, emulated: bool = False) -> list[Host]:
    return [
        Host(f"g{i}", f"10.0.0.{i + 1}", "ens3", None, gpus=tuple(range(i * per_host, (i + 1) * per_host))
             if emulated else tuple(range(per_host)), emulated=emulated)  # fmt: skip
        for i in range(n)
    ]


def make_plan(trial: Trial, hosts: list[Host], *, world_size_given=True, user_env=(), env=None, threads=0):
    t = resolve(trial, hosts, world_size_given=world_size_given)
    return t, plan(t, hosts, out_dir=PurePosixPath("/tmp/out"), master_port=23456, collective_timeout_s=60,
                   threads=threads, cluster_name="x", controller_env=SECRET if env is None else env,
                   user_env=user_env)  # fmt: skip


# ------------------------------------------------------------------------------------------------ placement
def test_two_hosts_two_ranks_each_follow_torchruns_layout():
    t, p = make_plan(Trial("syncsgd", None, 4, ranks_per_host=2), cpu_hosts(3))
    assert (t.backend, t.ranks_per_host, p.world_size, len(p.hosts)) == ("gloo", 2, 4, 2)
    layout = [(r.rank, r.host.name, r.local_rank, r.env["GROUP_RANK"], r.env["LOCAL_WORLD_SIZE"]) for r in p.ranks]
    assert layout == [(0, "h0", 0, "0", "2"), (1, "h0", 1, "0", "2"), (2, "h1", 0, "1", "2"), (3, "h1", 1, "1", "2")]
    assert {r.env["MASTER_ADDR"] for r in p.ranks} == {"10.77.0.1"}
    assert {r.env["WORLD_SIZE"] for r in p.ranks} == {"4"}
    assert {r.env["GLOO_SOCKET_IFNAME"] for r in p.ranks} == {"eth0"}


def test_default_world_size_is_every_host_times_its_ranks():
    t, p = make_plan(Trial("syncsgd", None, 1, backend="nccl"), gpu_hosts(2, 8), world_size_given=False)
    assert (t.ranks_per_host, t.world_size, p.world_size) == (8, 16, 16)
    assert [r.local_rank for r in p.ranks[:8]] == list(range(8))


def test_auto_backend_is_nccl_only_when_every_used_host_has_cuda():
    assert resolve(Trial("syncsgd", None, 2), gpu_hosts(2, 1)).backend == "nccl"
    assert resolve(Trial("syncsgd", None, 2), cpu_hosts(2)).backend == "gloo"
    mixed = [gpu_hosts(1, 1)[0], cpu_hosts(2)[1]]
    assert resolve(Trial("syncsgd", None, 2), mixed).backend == "gloo"
    # an explicit gloo on GPU hosts is the user's choice
    assert resolve(Trial("syncsgd", None, 2, backend="gloo"), gpu_hosts(2, 1)).backend == "gloo"


@pytest.mark.parametrize(
    "trial, hosts, message",
    [
        (Trial("syncsgd", None, 2, backend="nccl"), cpu_hosts(2), "--backend nccl: host h0 has no CUDA device"),
        (Trial("syncsgd", None, 4, ranks_per_host=2, backend="nccl"), gpu_hosts(2, 1),
         "--ranks-per-host 2: host g0 has 1 GPU(s)"),
        (Trial("syncsgd", None, 6, ranks_per_host=2), cpu_hosts(2), "needs 3 hosts; the cluster has 2"),
        (Trial("syncsgd", None, 3), gpu_hosts(2, 2), "--world-size 3 is not a multiple of --ranks-per-host 2"),
    ],
)  # fmt: skip
def test_impossible_placements_are_refused_naming_the_cause(trial, hosts, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(trial, hosts)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"world_size": 3, "ranks_per_host": 2}, "not a multiple of --ranks-per-host 2"),
        ({"ranks_per_host": 0}, "--ranks-per-host 0"),
        ({"backend": "mpi"}, "--backend 'mpi': accepted auto, gloo, nccl"),
        ({"intra_host": "nvlink"}, "--intra-host 'nvlink': accepted p2p, socket"),
        ({"nccl_socket_nthreads": 16, "nccl_nsocks_perthread": 8}, "= 128; NCCL accepts a product of at most 64"),
        ({"nccl_socket_nthreads": 0}, "--nccl-socket-nthreads 0"),
        ({"nccl_env": (("OMP_NUM_THREADS", "2"),)}, "only NCCL_\\* variables"),
        ({"nccl_env": (("NCCL_SOCKET_IFNAME", "lo"),)}, "set by the testbed"),
    ],
)
def test_bad_trial_settings_are_refused_before_anything_starts(fields, message):
    with pytest.raises(InputError, match=message):
        Trial("syncsgd", None, **{"world_size": 2, **fields})


# ------------------------------------------------------------------------------------------------ environment
def test_controller_environment_never_reaches_a_rank_except_the_allowlist():
    _, p = make_plan(Trial("syncsgd", None, 2), cpu_hosts(2, emulated=False), threads=1)
    for r in p.ranks:
        for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "PATH", "HOME", "LD_LIBRARY_PATH"):
            assert name not in r.env, name
        assert "ghp_secret" not in " ".join(r.argv) + " ".join(r.env.values())
        assert r.env["NCCL_DEBUG"] == "INFO" and r.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
        assert "CUDA_VISIBLE_DEVICES" not in r.env  # never the controller's; CPU hosts get none
        assert r.env["OMP_NUM_THREADS"] == "1" and r.env["PYTHONUNBUFFERED"] == "1"


def test_emulated_hosts_get_the_controllers_loader_and_interpreter_variables_and_no_secret():
    env = {**SECRET, "PYTHONPATH": "/ctl/py::rel/dir:/ctl/py2", "VIRTUAL_ENV": "/ctl/venv", "CONDA_PREFIX": "/c",
           "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:"}  # fmt: skip
    _, p = make_plan(Trial("syncsgd", None, 2), cpu_hosts(2), env=env, threads=1)
    for r in p.ranks:
        assert r.env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"  # an empty entry would mean the cwd: dropped
        assert r.env["PYTHONPATH"] == "/ctl/py:/ctl/py2"  # relative and empty entries dropped too
        assert (r.env["VIRTUAL_ENV"], r.env["CONDA_PREFIX"], r.env["HOME"]) == ("/ctl/venv", "/c", "/root")
        assert "GITHUB_TOKEN" not in r.env and "AWS_SECRET_ACCESS_KEY" not in r.env and "PATH" not in r.env
        assert r.env["OMP_NUM_THREADS"] == "1"  # the plan's thread count, not the controller's 3
    _, p = make_plan(Trial("mypkg.comp:make", None, 2, plugin_path="/plugins"), cpu_hosts(2), env=env)
    assert p.ranks[0].env["PYTHONPATH"] == "/plugins:/ctl/py:/ctl/py2"  # the plugin first
    _, p = make_plan(Trial("mypkg.comp:make", None, 2, plugin_path="/plugins"), cpu_hosts(2, emulated=False), env=env)
    assert p.ranks[0].env["PYTHONPATH"] == "/plugins" and "VIRTUAL_ENV" not in p.ranks[0].env  # lab: only the plugin


def test_user_named_variables_reach_every_rank_and_are_redacted_in_the_dry_run():
    _, p = make_plan(Trial("syncsgd", None, 2), cpu_hosts(2), user_env=(("WANDB_API_KEY", "k-123"),))
    assert all(r.env["WANDB_API_KEY"] == "k-123" for r in p.ranks)
    shown = p.to_json()
    assert all(r["env"]["WANDB_API_KEY"] == "***" for r in shown["ranks"])
    assert "k-123" not in str(shown)


@pytest.mark.parametrize("key", ["RANK", "MASTER_ADDR", "NCCL_ALGO", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"])
def test_env_may_not_override_what_the_testbed_sets(key):
    with pytest.raises(InputError, match=f"--env {key}"):
        make_plan(Trial("syncsgd", None, 2), cpu_hosts(2), user_env=((key, "1"),))


def test_nccl_over_sockets_on_the_data_interface_of_lab_hosts():
    t = Trial("powersgd", None, 16, ranks_per_host=8, nccl_socket_nthreads=4, nccl_nsocks_perthread=8,
              nccl_env=(("NCCL_ALGO", "Ring"),))  # fmt: skip
    _, p = make_plan(t, gpu_hosts(2, 8))
    env = p.ranks[9].env
    assert env["NCCL_NET"] == "Socket" and env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "=ens3"  # exact match, not a prefix
    assert (env["NCCL_SOCKET_NTHREADS"], env["NCCL_NSOCKS_PERTHREAD"], env["NCCL_ALGO"]) == ("4", "8", "Ring")
    assert "NCCL_P2P_DISABLE" not in env and "NCCL_SHM_DISABLE" not in env  # NVLink/P2P/SHM inside a host
    assert "NCCL_HOSTID" not in env and "CUDA_VISIBLE_DEVICES" not in env  # real hosts keep their own
    assert (env["LOCAL_RANK"], env["GROUP_RANK"]) == ("1", "1")
    assert p.nccl_settings()["NCCL_ALGO"] == "Ring"
    _, p = make_plan(Trial("syncsgd", None, 2, intra_host="socket"), gpu_hosts(2, 1))
    assert p.ranks[0].env["NCCL_P2P_DISABLE"] == "1" and p.ranks[0].env["NCCL_SHM_DISABLE"] == "1"


def test_emulated_gpu_hosts_get_their_devices_and_distinct_nccl_host_ids():
    hosts = gpu_hosts(4, 2, emulated=True)  # one 8-GPU server as 4 shaped hosts
    _, p = make_plan(Trial("syncsgd", None, 8), hosts, world_size_given=False)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in p.ranks] == ["0,1", "0,1", "2,3", "2,3", "4,5", "4,5", "6,7", "6,7"]
    host_ids = {r.host.name: r.env["NCCL_HOSTID"] for r in p.ranks}
    assert len(set(host_ids.values())) == 4
    assert [r.env["LOCAL_RANK"] for r in p.ranks[:2]] == ["0", "1"]  # cuda:LOCAL_RANK within the host's devices


def test_gpus_are_shared_out_among_emulated_hosts():
    assert assign_gpus([0, 1, 2, 3, 4, 5, 6, 7], 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert assign_gpus([0, 1, 2], 2) == [[0], [1]]
    assert assign_gpus([0], 3) == [[0], [0], [0]]  # several hosts on one GPU, each its own NCCL host id
    assert assign_gpus([], 2) == [[], []]
    assert parse_gpus_flag("all", [0, 1]) == [0, 1] and parse_gpus_flag(None, []) == []
    with pytest.raises(InputError, match="no CUDA device on this machine"):
        parse_gpus_flag("all", [])
    with pytest.raises(InputError, match="device 3 does not exist"):
        parse_gpus_flag("0,3", [0, 1])


# ------------------------------------------------------------------------------------------------ argv contract
def test_the_rank_parses_exactly_what_the_launcher_built():
    t = Trial("powersgd", 10**9, 4, ranks_per_host=2, options=(("rank", 4), ("start_iter", 3)), serial=True,
              overlap=False, bucket_cap_mb=12.5)  # fmt: skip
    _, p = make_plan(t, cpu_hosts(2), threads=1)
    r = p.ranks[3]
    assert r.argv[:2] == ("-m", "runners.train")
    args = RankArgs.from_argv(list(r.argv[2:]))
    assert (args.compressor, args.option_dict, args.serial, args.overlap) == ("powersgd", {"rank": 4, "start_iter": 3},
                                                                              True, False)  # fmt: skip
    assert (args.backend, args.iface, args.bucket_cap_mb, args.threads, args.out) == ("gloo", "eth0", 12.5, 1, "/tmp/out")
    env = RankEnv.from_environ(r.env)
    assert (env.rank, env.local_rank, env.local_world_size, env.group_rank, env.world_size) == (3, 1, 2, 1, 4)


def test_the_ssh_command_line_of_a_lab_rank_carries_only_the_plan():
    """What `ps` shows on a lab host: the rank's argv and its allowlisted environment, nothing of the controller's."""
    from testbed.cluster.ssh import detached_command_line

    _, p = make_plan(Trial("powersgd", None, 2, backend="nccl"), gpu_hosts(2, 1))
    r = p.ranks[1]
    from testbed.cluster.ssh import env_file_text

    line = detached_command_line(["/opt/testbed/venv/bin/python", *r.argv], cwd="/opt/testbed/src",
                                 run_dir="/tmp/tb-c-h1-x", marker="TOKEN=x")  # fmt: skip
    sent = env_file_text(dict(r.env)).decode()  # over stdin into a 0600 file, never on the command line
    for secret in ("ghp_secret", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "/controller/bin", "/controller/lib"):
        assert secret not in line and secret not in sent
    assert "NCCL_SOCKET_IFNAME==ens3" in sent and "RANK=1" in sent
    assert "NCCL_SOCKET_IFNAME" not in line and "RANK=" not in line
    assert "CUDA_VISIBLE_DEVICES" not in sent  # the host's own devices apply
