"""What the controller makes of a lab host's facts (gathered on the host by host_facts.py, sent as source): is the
host fit to take part (`evaluate_facts`), do the hosts agree on their versions (`version_disagreements`), the one error
that names every problem (`problems_error`), and the links `status` reports from the shaping a host read back."""

from __future__ import annotations

import importlib.resources
from typing import Any

from testbed.cluster.lab.inventory import LabHostSpec
from testbed.errors import ClusterError, InputError, TestbedError

MIN_PYTHON = (3, 11)

# Runs on each host with the host's Python (its source is sent: the host may not have this checkout's version).
HOST_FACTS = importlib.resources.files("testbed.cluster.lab").joinpath("host_facts.py").read_text()


def evaluate_facts(
    spec: LabHostSpec, facts: dict[str, Any], *, rate_bps: int | None = None, allow_cpu: bool = False
) -> list[tuple[type[TestbedError], str]]:
    """What stops this host from taking part, as (error class, one-line message) pairs. Pure: unit-tested."""
    from shaping.units import format_rate

    problems: list[tuple[type[TestbedError], str]] = []
    n = spec.name
    version = tuple(facts.get("python") or (0,))
    if version < MIN_PYTHON:
        problems.append(
            (
                ClusterError,
                f"host {n}: Python {'.'.join(map(str, version))} at {spec.python} is too old; the testbed needs "
                f"{'.'.join(map(str, MIN_PYTHON))}+ (set testbed_python, or run the provision playbook)",
            )
        )
        return problems
    if not facts.get("iface_exists"):
        have = ", ".join(facts.get("ifaces") or []) or "none"
        problems.append(
            (
                ClusterError,
                f"host {n}: no data interface {spec.data_iface!r} (testbed_data_iface); the host has: {have}",
            )
        )
    if not facts.get("project"):
        problems.append(
            (
                ClusterError,
                f"host {n}: the testbed is not importable by {spec.python} in "
                f"{spec.project_dir} ({facts.get('project_error', '?')}); run the provision "
                "playbook",
            )
        )
    if facts.get("torch") is None:
        problems.append(
            (ClusterError, f"host {n}: torch is not importable by {spec.python} ({facts.get('torch_error', '?')})")
        )
    if spec.gpus and facts.get("gpus", 0) < spec.gpus and not allow_cpu:
        problems.append(
            (
                ClusterError,
                f"host {n}: testbed_gpus_per_host is {spec.gpus} but nvidia-smi shows {facts.get('gpus', 0)} GPUs"
                f"{'' if facts.get('nvidia_smi') else ' (nvidia-smi not found)'}; pass --allow-cpu to run on CPU",
            )
        )
    speed = facts.get("nic_speed_mbps")
    if rate_bps and speed and speed * 1_000_000 < rate_bps:
        problems.append(
            (
                InputError,
                f"host {n}: {spec.data_iface} links at {format_rate(speed * 1e6)}, slower than the requested "
                f"{format_rate(rate_bps)}; shaping can only lower a rate",
            )
        )
    return problems


AGREEING_VERSIONS = (("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"), ("driver_version", "NVIDIA driver"))


def version_disagreements(facts_by_host: dict[str, dict[str, Any]]) -> list[str]:
    """One line per software version that differs between hosts (torch, CUDA, NCCL, driver). Ranks of one job with
    mixed NCCL versions hang or fail in ways users cannot debug, so `up` refuses such a cluster. Pure: unit-tested."""
    out = []
    for key, what in AGREEING_VERSIONS:
        seen: dict[str, list[str]] = {}
        for host, facts in sorted(facts_by_host.items()):
            seen.setdefault(str(facts.get(key) or "none"), []).append(host)
        if len(seen) > 1:
            groups = "; ".join(f"{v} on {', '.join(hosts)}" for v, hosts in sorted(seen.items()))
            out.append(f"hosts disagree on the {what} version ({groups}); install one version on every host "
                       "(the provision playbook does, from one checkout)")  # fmt: skip
    return out


def problems_error(problems: list[tuple[type[TestbedError], str]]) -> TestbedError:
    """One error naming every problem: InputError when all are bad input, the one kind when all agree, else (or with
    any ClusterError among them) ClusterError."""
    kinds = {k for k, _ in problems}
    cls = (
        InputError
        if kinds == {InputError}
        else ClusterError
        if ClusterError in kinds or len(kinds) > 1
        else next(iter(kinds))
    )
    return cls("; ".join(m for _, m in problems))


def status_fields(facts: dict[str, Any], data_iface: str) -> dict[str, Any]:
    """What `status` reports of a reachable host from its facts: versions, GPUs, NIC speed, peers and both links."""
    sh = facts.get("shaping") or {}
    ing = (sh.get("ingress") or {}).get("shaping") or {}
    return dict(
        reachable=True,
        peers=(sh.get("egress") or {}).get("peers") or [],
        gpus=facts.get("gpus", 0),
        nic_speed_mbps=facts.get("nic_speed_mbps"),
        python=".".join(map(str, facts.get("python", []))),
        torch=facts.get("torch"),
        cuda=facts.get("cuda"),
        nccl=facts.get("nccl"),
        driver=facts.get("driver_version"),
        gpu_name=facts.get("gpu_name"),
        links={
            "upload": {"ifname": data_iface, **(sh.get("egress") or {})},
            "download": {"ifname": (sh.get("ingress") or {}).get("ifb"), **ing},
        },
    )
