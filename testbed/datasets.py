"""A trial's data set on the hosts: `--data` is checked on every host before any trial starts (exit 2 naming the
host). The check is runners/datafiles.py (standard library only), sent as source and run with the host's Python, so
it needs nothing of the project installed there and tells the same story the rank would tell."""

from __future__ import annotations

import inspect
import sys

from runners import catalog, datafiles
from testbed.errors import InputError

HOST_CHECK_TIMEOUT_S = 60.0


def check_hosts(cluster, hosts, trials) -> None:
    """Every non-synthetic data set of `trials` is present and well formed on each host; InputError naming the host
    and what was missing otherwise. Nothing is started or changed."""
    source = inspect.getsource(datafiles)
    specs = sorted({t.data for t in trials if t.data != catalog.DEFAULT_DATA})
    for spec in specs:
        entry, root = catalog.parse_data(spec)
        for host in hosts:
            done = cluster.run(host, [sys.executable, "-I", "-c", source, entry.kind, root or ""],
                               timeout_s=HOST_CHECK_TIMEOUT_S)  # fmt: skip
            if done.returncode != 0:
                lines = [ln for ln in (done.stderr or "").strip().splitlines() if ln.strip()]
                why = lines[-1] if lines else f"exit {done.returncode}"
                raise InputError(f"--data {spec}: host {host.name}: {why}")
