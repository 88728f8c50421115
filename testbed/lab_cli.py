"""`testbed up --inventory FILE` and `testbed down` for lab clusters (called from testbed/cli.py).

up: read the inventory, run the provision playbook (unless --no-provision), check every host (reachability, host
keys, data NIC, Python, GPUs, NIC speed against --bw), shape if --bw was given (commit-confirmed), then record the
cluster so `status`, `exec`, `shape`, `run`, `sweep` and `down` reopen it by name. Nothing half-done: a failure after
shaping clears it again, and no record is written.
"""

from __future__ import annotations

import argparse
import json
import sys

from shaping.plan import LinkShape
from testbed.cluster import registry
from testbed.cluster.lab import LabCluster
from testbed.errors import TestbedError


def lab_up(args: argparse.Namespace, shape: LinkShape | None) -> int:
    name = registry.check_name(args.name)
    cluster = LabCluster.from_inventory(
        args.inventory,
        name=name,
        accept_new_host_keys=bool(getattr(args, "accept_new_host_keys", False)),
        allow_cpu=bool(getattr(args, "allow_cpu", False)),
    )
    shaped = False
    try:
        cluster.provision(
            run_playbook=not getattr(args, "no_provision", False), rate_bps=shape.rate_bps if shape else None
        )
        if shape is not None:
            cluster.apply_shaping(shape)
            shaped = True
        cluster.record = {**cluster.to_record(), "shape": shape.to_dict() if shape else None}
        registry.save_record(name, cluster.record)
        status = cluster.status()
    except BaseException:
        if shaped:
            try:
                cluster.clear_shaping()
            except TestbedError:
                pass
        cluster.close()
        raise
    cluster.close()
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps({"created": True, **status}, indent=2, default=str) + "\n")
        return 0
    hosts = status["hosts"]
    what = shape.describe() if shape else "unshaped"
    sys.stdout.write(f"lab cluster {name}: {len(hosts)} hosts up, {what} on every data NIC\n")
    for h in hosts:
        sys.stdout.write(
            f"  {h['name']:<12} {h['address']:<16} {h['data_iface']:<12} gpus {h.get('gpus', '?')}  "
            f"nic {h.get('nic_speed_mbps') or '?'} Mbit/s  python {h.get('python', '?')}  torch {h.get('torch', '?')}  "
            f"nccl {h.get('nccl') or '-'}\n"
        )
    return 0


def lab_down(name: str) -> None:
    """Clear shaping on every host, end the rank process groups of this cluster, forget the record."""
    record = registry.load_record(name)
    if record is None:
        return
    LabCluster.from_record(record).down()
    registry.delete_record(name)
