"""Where each rank runs and what it is given: backend, ranks per host, devices, argv and an allowlisted environment.

Pure functions over a Trial and the cluster's hosts (no processes, no tc, no torch), so every rule is unit-tested and
`testbed run --dry-run` prints exactly what would be started.

Placement (torchrun's layout): hosts h0..h(H-1) each run `ranks_per_host` ranks; rank r = host_index x
ranks_per_host + local_rank, GROUP_RANK = host_index, and a rank on a CUDA host uses cuda:LOCAL_RANK.

Environment: a rank never inherits the controller's environment. It gets
  - torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT);
  - from the controller, only NCCL_*, GLOO_*, TORCH_* and CUDA_* variables (never CUDA_VISIBLE_DEVICES: the host's
    own assignment decides) and the OMP/MKL thread counts;
  - what the testbed sets: PYTHONUNBUFFERED, the thread counts on emulated hosts, GLOO_SOCKET_IFNAME or the NCCL socket
    settings (NCCL_NET=Socket, NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME==<data iface>, socket threads), and on emulated
    hosts CUDA_VISIBLE_DEVICES and a distinct NCCL_HOSTID, so NCCL treats each as a machine of its own;
  - on emulated hosts (the same machine as the controller), the loader and interpreter variables the controller runs
    with (LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, CONDA_PREFIX, HOME: what GPU images and HPC module systems use to
    find libcuda/libnccl and the Python packages); the local backend adds PATH and the project's code root;
  - PYTHONPATH = the trial's --plugin-path when its compressor is a MODULE:FACTORY plugin (first, before the
    controller's PYTHONPATH on emulated hosts; alone on lab hosts);
  - the trial's --nccl-env and the run's --env, which the user named.
Everything else (tokens, cloud credentials, SSH agents, ...) stays on the controller; on lab and Slurm hosts the
host's own login environment applies instead of the controller's (docs/lab-guide.md, "What reaches a rank's
environment").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from runners.contract import TORCHRUN_KEYS, RankArgs, torchrun_env
from testbed import trial_shape
from testbed.cluster.base import Host
from testbed.config import NCCL_PINNED, Trial
from testbed.errors import InputError

FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_")
FORWARDED_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
NEVER_FORWARDED = ("CUDA_VISIBLE_DEVICES",)
# emulated hosts are this machine: what its loader and interpreter need to find libcuda, libnccl and the packages
EMULATED_HOST_NAMES = ("LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "HOME")
SET_BY_TESTBED = (*TORCHRUN_KEYS, *NCCL_PINNED, "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")


# ------------------------------------------------------------------------------------------------ resolution
def default_ranks_per_host(hosts: list[Host]) -> int:
    """The hosts' GPU count when every host has the same number > 0 (lab: testbed_gpus_per_host), else 1."""
    counts = {len(h.gpus) for h in hosts}
    return counts.pop() if len(counts) == 1 and 0 not in counts else 1


def resolve_on(cluster: Any, trials: list[Trial], *, world_size_given: bool = True,
               hosts: list[Host] | None = None) -> list[Trial]:  # fmt: skip
    """`resolve` each trial against the cluster's hosts (`hosts` when the caller has them already) and its racks
    (racks and uplink are part of a trial's id: a rack trial is not the flat one stored beside it)."""
    hosts, racks = hosts if hosts is not None else cluster.hosts(), trial_shape.on_racks(cluster)
    return [resolve(t, hosts, world_size_given=world_size_given, racks=racks) for t in trials]


def resolve(trial: Trial, hosts: list[Host], *, world_size_given: bool = True,
            racks: tuple[int, int | None] | None = None) -> Trial:  # fmt: skip
    """The trial with backend, ranks per host and world size made concrete for these hosts, and with `racks`, the
    cluster's (racks, uplink_bps) (trial_shape.on_racks; None: keep the trial's); InputError (exit 2, nothing
    started) when the hosts cannot run it. `world_size_given=False`: the world size is every host's ranks."""
    if racks is not None:
        trial = dataclasses.replace(trial, racks=racks[0], uplink_bps=racks[1])
    if not hosts:
        raise InputError("the cluster has no hosts")
    rph = trial.ranks_per_host or default_ranks_per_host(hosts)
    world = trial.world_size if world_size_given else len(hosts) * rph
    if world % rph:
        raise InputError(
            f"--world-size {world} is not a multiple of --ranks-per-host {rph}; every host runs the same number of "
            f"ranks (e.g. --world-size {rph * max(1, world // rph)})"
        )
    n_hosts = world // rph
    if n_hosts > len(hosts):
        raise InputError(
            f"--world-size {world} with {rph} rank(s) per host needs {n_hosts} hosts; the cluster has {len(hosts)} "
            f"(use `testbed up --hosts {n_hosts} --recreate`, a smaller --world-size or more --ranks-per-host)"
        )
    used = hosts[:n_hosts]
    without_cuda = [h.name for h in used if not h.gpus]
    backend = trial.backend
    if backend == "auto":
        backend = "gloo" if without_cuda else "nccl"
    if backend == "nccl":
        if without_cuda:
            raise InputError(
                f"--backend nccl: host {without_cuda[0]} has no CUDA device"
                f"{' (nor ' + ', '.join(without_cuda[1:]) + ')' if len(without_cuda) > 1 else ''}; use --backend gloo, "
                "or `testbed up --gpus all` on a machine with GPUs"
            )
        short = [h for h in used if len(h.gpus) < rph]
        if short:
            h = short[0]
            raise InputError(
                f"--ranks-per-host {rph}: host {h.name} has {len(h.gpus)} GPU(s); NCCL needs one GPU per rank on a "
                "host (use --ranks-per-host <= the GPU count)"
            )
    return dataclasses.replace(trial, backend=backend, ranks_per_host=rph, world_size=world)


# ------------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class RankLaunch:
    rank: int
    host: Host
    local_rank: int
    argv: tuple[str, ...]  # without the interpreter: ("-m", runner, flags...)
    env: Mapping[str, str]
    log_name: str


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    backend: str
    ranks_per_host: int
    hosts: tuple[Host, ...]
    ranks: tuple[RankLaunch, ...]
    user_env_keys: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def nccl_settings(self) -> dict[str, str]:
        """The NCCL_* variables rank 0 gets (recorded in the results row)."""
        return {k: v for k, v in sorted(self.ranks[0].env.items()) if k.startswith("NCCL_")} if self.ranks else {}

    def to_json(self, *, redact_user_env: bool = True) -> dict[str, Any]:
        """What `testbed run --dry-run` prints. Values of --env variables are shown as *** (the user may pass secrets)."""

        def env_of(r: RankLaunch) -> dict[str, str]:
            hide = set(self.user_env_keys) if redact_user_env else set()
            return {k: ("***" if k in hide else v) for k, v in sorted(r.env.items())}

        return {
            "backend": self.backend,
            "hosts": len(self.hosts),
            "ranks_per_host": self.ranks_per_host,
            "world_size": self.world_size,
            "ranks": [
                {"rank": r.rank, "host": r.host.name, "local_rank": r.local_rank, "argv": list(r.argv),
                 "env": env_of(r), "log": r.log_name}  # fmt: skip
                for r in self.ranks
            ],
        }


def forwarded_env(controller_env: Mapping[str, str], *, emulated: bool = False) -> dict[str, str]:
    """The part of the controller's environment a rank may see (allowlist; see the module docstring). `emulated`:
    the rank runs on this machine (an emulated host), so the loader and interpreter variables go too."""
    out = {
        k: v
        for k, v in controller_env.items()
        if (k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES) and k not in NEVER_FORWARDED
    }
    if emulated:
        for k in EMULATED_HOST_NAMES:
            v = controller_env.get(k, "")
            if k in SEARCH_PATHS:  # an empty or relative entry means "the current directory": never for a root rank
                v = _join_paths(*(p for p in v.split(":") if p.startswith("/")))
            if v:
                out[k] = v
    return out


SEARCH_PATHS = ("LD_LIBRARY_PATH", "PYTHONPATH")


def _join_paths(*parts: str | None) -> str:
    return ":".join(p for p in parts if p)


def backend_env(trial: Trial, host: Host, cluster_name: str) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME, or NCCL over sockets on the host's data interface (plus the emulated-host settings)."""
    if trial.backend == "gloo":
        env = {"GLOO_SOCKET_IFNAME": host.data_iface}
    else:
        env = {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=" + host.data_iface}
        if trial.nccl_socket_nthreads:
            env["NCCL_SOCKET_NTHREADS"] = str(trial.nccl_socket_nthreads)
        if trial.nccl_nsocks_perthread:
            env["NCCL_NSOCKS_PERTHREAD"] = str(trial.nccl_nsocks_perthread)
        if trial.intra_host == "socket":
            env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
        if host.emulated:  # several emulated hosts on one machine: NCCL must not see them as one host
            env["NCCL_HOSTID"] = f"testbed-{cluster_name}-{host.name}"
        env.update(trial.nccl_env)
    if host.emulated and host.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in host.gpus)
    return env


def check_user_env(user_env: tuple[tuple[str, str], ...]) -> None:
    for key, _ in user_env:
        if key in SET_BY_TESTBED or key.startswith("NCCL_"):
            raise InputError(
                f"--env {key}: set by the testbed for every rank"
                f"{' (use --nccl-env for NCCL_* settings)' if key.startswith('NCCL_') else ''}; "
                "--env is for further variables your ranks need"
            )


def plan(
    trial: Trial,
    hosts: list[Host],
    *,
    out_dir: PurePath,
    master_port: int,
    collective_timeout_s: float,
    threads: int,
    cluster_name: str,
    controller_env: Mapping[str, str],
    user_env: tuple[tuple[str, str], ...] = (),
) -> LaunchPlan:
    """Every rank's host, local rank, argv and environment. `trial` must be resolved (see `resolve`)."""
    if trial.backend not in ("gloo", "nccl") or trial.ranks_per_host is None:
        raise ValueError("plan() needs a resolved trial (testbed.launch_plan.resolve)")
    check_user_env(user_env)
    rph = trial.ranks_per_host
    used = hosts[: trial.world_size // rph]
    common = forwarded_env(controller_env)
    common["PYTHONUNBUFFERED"] = "1"
    if threads:  # emulated hosts share this machine's cores
        common.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    ranks = []
    for host_index, host in enumerate(used):
        base = dict(common)
        if host.emulated:  # this machine: its loader and interpreter variables (thread counts stay the plan's)
            base.update({k: v for k, v in forwarded_env(controller_env, emulated=True).items() if k not in common})
        if trial.plugin_path:  # a plugin compressor's directory: first on the rank's import path
            base["PYTHONPATH"] = _join_paths(trial.plugin_path, base.get("PYTHONPATH") if host.emulated else None)
        args = RankArgs(
            model=trial.model,
            out=str(out_dir),
            compressor=trial.compressor,
            options=trial.options,
            batch_size=trial.batch_size,
            image_size=trial.image_size,
            seq_len=trial.seq_len,
            iters=trial.iters,
            warmup_iters=trial.warmup_iters,
            seed=trial.seed,
            backend=trial.backend,
            iface=host.data_iface,
            timeout_s=collective_timeout_s,
            bucket_cap_mb=trial.bucket_cap_mb,
            serial=trial.serial,
            overlap=trial.overlap,
            skew_probe=trial.skew_probe,
            threads=threads,
            timeline_iters=trial.timeline_iters,
            trace_iters=trial.trace_iters,
            data=trial.data,
            eval_every=trial.eval_every,
            target_accuracy=trial.target_accuracy,
            max_steps=trial.max_steps,
            **({"lr": trial.lr} if trial.lr is not None else {}),
        )
        host_env = {**base, **backend_env(trial, host, cluster_name)}
        for local_rank in range(rph):
            rank = host_index * rph + local_rank
            env = {
                **host_env,
                **torchrun_env(rank=rank, world_size=trial.world_size, local_rank=local_rank, local_world_size=rph,
                               group_rank=host_index, master_addr=used[0].address, master_port=master_port),  # fmt: skip
                **dict(user_env),
            }
            ranks.append(RankLaunch(rank, host, local_rank, ("-m", trial.runner, *args.to_argv()), env,
                                    f"rank{rank}.log"))  # fmt: skip
    return LaunchPlan(trial.backend, rph, tuple(used), tuple(ranks), tuple(k for k, _ in user_env))
