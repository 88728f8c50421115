"""What this kernel offers for shaping: `check()` probes htb, tbf, netem, the ifb leaves (bfifo, fq_codel), ifb,
the ingress qdisc and the u32 + mirred redirect in a throwaway network namespace (`python -m shaping kernel-check`).
The probe uses the handles the testbed itself uses (one home: shaping.plan and shaping.ingress)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
from typing import Any

from shaping import commit_confirm
from shaping.errors import ShapingError
from shaping.ingress import INGRESS_HANDLE, LEAF_HANDLE
from shaping.plan import CLASS_HANDLE, NETEM_HANDLE, ROOT_HANDLE
from shaping.tc import TC_H_ROOT

REQUIRED = ("htb", "tbf", "ifb", "ingress", "u32_mirred")  # what the testbed cannot shape without


def probe() -> dict[str, bool]:
    """Runs inside a fresh, private network namespace (`check` starts it there): try each piece on a veth pair, with
    the handles the testbed uses (shaping.plan, shaping.ingress)."""
    from pyroute2 import protocols

    from shaping import ingress  # noqa: F401 - registers the bfifo kind with pyroute2
    from shaping.netns_route import open_route

    results: dict[str, bool] = {}
    with open_route(None) as ipr:  # this process's own namespace
        ipr.link("add", ifname="kc0", kind="veth", peer="kc1")
        idx = ipr.link_lookup(ifname="kc0")[0]
        for kind, kw in (("htb", {"default": 1}), ("tbf", {"rate": 1e6, "burst": 65536, "latency": 50000})):
            try:
                ipr.tc("add", kind, idx, ROOT_HANDLE, **kw)
                ipr.tc("del", index=idx, handle=ROOT_HANDLE, parent=TC_H_ROOT)
                results[kind] = True
            except Exception:  # noqa: BLE001
                results[kind] = False
        try:
            ipr.tc("add", "htb", idx, ROOT_HANDLE, default=1)
            ipr.tc("add", "netem", idx, NETEM_HANDLE, parent=ROOT_HANDLE, delay=1000)
            results["netem"] = True
        except Exception:  # noqa: BLE001
            results["netem"] = False
        for leaf, kw in (("bfifo", {"limit": 100_000}), ("fq_codel", {})):  # the ifb leaf; fq_codel: the other choice
            with contextlib.suppress(Exception):  # what the netem check left
                ipr.tc("del", index=idx, handle=ROOT_HANDLE, parent=TC_H_ROOT)
            try:
                ipr.tc("add", "htb", idx, ROOT_HANDLE, default=1)
                ipr.tc("add-class", "htb", idx, CLASS_HANDLE, parent=ROOT_HANDLE, rate=1e6, ceil=1e6, burst=65536,
                       cburst=65536, quantum=1514)  # fmt: skip
                ipr.tc("add", leaf, idx, LEAF_HANDLE, parent=CLASS_HANDLE, **kw)
                results[leaf] = any(q.get_attr("TCA_KIND") == leaf for q in ipr.get_qdiscs(index=idx))
            except Exception:  # noqa: BLE001
                results[leaf] = False
            with contextlib.suppress(Exception):
                ipr.tc("del", index=idx, handle=ROOT_HANDLE, parent=TC_H_ROOT)
        try:
            ipr.link("add", ifname="kcifb", kind="ifb")
            results["ifb"] = True
        except Exception:  # noqa: BLE001
            results["ifb"] = False
        try:
            ipr.tc("add", "ingress", idx, INGRESS_HANDLE)
            results["ingress"] = True
            target = ipr.link_lookup(ifname="kcifb" if results["ifb"] else "kc1")[0]
            ipr.tc(
                "add-filter",
                "u32",
                idx,
                parent=INGRESS_HANDLE,
                prio=1,
                protocol=protocols.ETH_P_ALL,
                target=1,
                keys=["0x0/0x0+0"],
                action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": target},
            )
            results["u32_mirred"] = True
        except Exception:  # noqa: BLE001
            results.setdefault("ingress", False)
            results["u32_mirred"] = False
    return results


def check() -> dict[str, Any]:
    """Which qdiscs and actions this kernel offers, probed in a throwaway network namespace of a child process (this
    one's namespace is never touched): {"features": {...}, "ok": every REQUIRED one there, "required": [...]}."""
    def enter_private_netns() -> None:
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")

    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); import json, shaping.kernel as k; "
    code += "print(json.dumps(k.probe()))"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, str(commit_confirm.PROJECT_ROOT)],  # -I: nothing of cwd or PYTHONPATH
        capture_output=True,
        text=True,
        preexec_fn=enter_private_netns,  # noqa: PLW1509 - single-threaded CLI
        cwd="/",
        timeout=60,
    )
    if proc.returncode != 0:
        raise ShapingError(f"kernel-check failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    features = json.loads(proc.stdout)
    return {"features": features, "ok": all(features[k] for k in REQUIRED), "required": list(REQUIRED)}
