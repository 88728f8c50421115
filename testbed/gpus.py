"""This machine's CUDA devices, as the controller sees them without importing torch (`nvidia-smi`).

`testbed up --gpus all|none|0,1,...` shares them out among emulated hosts (`assign_gpus`).
"""

from __future__ import annotations

import shutil
import subprocess

from testbed.errors import InputError


def visible_gpus() -> list[int]:
    """Indices of the CUDA devices `nvidia-smi` lists (honouring CUDA_VISIBLE_DEVICES is the ranks' business);
    [] when there is no nvidia-smi or it finds no device."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        res = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    if res.returncode != 0:
        return []
    return sorted(int(x) for x in res.stdout.split() if x.strip().isdigit())


def parse_gpus_flag(text: str | None, available: list[int] | None = None) -> list[int]:
    """`--gpus`: none (default), all, or a comma-separated list of device indices that exist here."""
    if text is None or text.strip().lower() == "none":
        return []
    have = visible_gpus() if available is None else available
    if not have:
        raise InputError(f"--gpus {text}: no CUDA device on this machine (nvidia-smi lists none); accepted: none")
    if text.strip().lower() == "all":
        return list(have)
    try:
        wanted = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--gpus {text!r}: expected all, none or device indices like 0,1") from None
    if not wanted:
        raise InputError(f"--gpus {text!r}: empty; expected all, none or device indices like 0,1")
    missing = [g for g in wanted if g not in have]
    if missing or len(set(wanted)) != len(wanted):
        raise InputError(
            f"--gpus {text}: {'device ' + str(missing[0]) + ' does not exist' if missing else 'an index repeats'}; "
            f"this machine has {', '.join(map(str, have))}"
        )
    return wanted


def assign_gpus(gpus: list[int], n_hosts: int) -> list[list[int]]:
    """Share this machine's GPUs out among the emulated hosts: contiguous, equal groups when there are at least as
    many GPUs as hosts (8 GPUs, 4 hosts: [0,1] [2,3] [4,5] [6,7]; leftovers unused), otherwise one GPU per host in
    turn, several hosts sharing one (each host still gets its own NCCL host id)."""
    if not gpus:
        return [[] for _ in range(n_hosts)]
    if len(gpus) >= n_hosts:
        k = len(gpus) // n_hosts
        return [list(gpus[i * k : (i + 1) * k]) for i in range(n_hosts)]
    return [[gpus[i % len(gpus)]] for i in range(n_hosts)]
