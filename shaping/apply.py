"""The host's shaping transactions as a library: apply (checked, all-or-nothing, commit-confirmed), clear, show.

`python -m shaping` (shaping/__main__.py) parses a command line into an `ApplyRequest` and prints what `apply`
returns; the validation of who may name what (shaping/caller.py) happens there first, before any of this runs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

from shaping import classify, commit_confirm, highrate, ingress, lockout, tc
from shaping.errors import InputError, ShapingError, TestbedError
from shaping.plan import LinkShape, render_tc


@dataclasses.dataclass(frozen=True)
class ApplyRequest:
    """One `apply`: the interface, its shaping and how to put it on (the flags of `python -m shaping apply`)."""

    dev: str
    shape: LinkShape
    netns: str | None = None
    peers: classify.Peers = ()
    ingress: bool = False
    force: bool = False
    force_mgmt_iface: bool = False
    mgmt_addr: tuple[str, ...] = ()
    offload: str = "off"  # off | auto | on
    confirm_within: float | None = None
    dry_run: bool = False
    state_dir: str | None = None


def render_ingress(dev: str, shape: LinkShape, netns: str | None, peers: classify.Peers = ()) -> list[str]:
    """The commands of the ingress shaping (ifb, redirect filters, the ifb's qdiscs) for --dry-run."""
    ip = f"ip -n {netns}" if netns else "ip"
    t = f"tc -n {netns}" if netns else "tc"
    ifb = ingress.ifb_name(dev)
    queues = _nic_queues(dev, netns)
    leaf = highrate.leaf_limit_bytes(shape.rate_bps, shape.effective_burst_bytes)
    leaf_line = [] if shape.needs_netem or shape.qdisc != "htb" else [
        f"{t} qdisc replace dev {ifb} parent 7e57:1 handle 7e59: bfifo limit {leaf}"
    ]  # fmt: skip
    return [
        f"{ip} link add {ifb} type ifb" + (f" numtxqueues {queues} numrxqueues {queues}" if queues else ""),
        f"{ip} link set {ifb} alias {ingress.IFB_ALIAS_PREFIX}{dev} up",
        f"{t} qdisc add dev {dev} handle ffff: ingress",
        *classify.render_ingress_filters(t, dev, ifb, peers),
        *render_tc(ifb, shape, netns),
        *leaf_line,
    ]


def _nic_queues(dev: str, netns: str | None) -> int | None:
    """The NIC's TX queue count for --dry-run (None when it cannot be read: no such device here, no permission)."""
    path = f"/sys/class/net/{dev}/queues"
    if netns:
        return None
    try:
        return max(1, sum(1 for q in os.listdir(path) if q.startswith("tx-")))
    except OSError:
        return None


def apply(req: ApplyRequest) -> dict[str, Any]:
    """The host's apply transaction: check everything that can be checked (management addresses, peers, the
    offload mode, the confirm window, the management interface) before anything changes; nothing changes when the
    interface already matches; otherwise put the egress (and ingress, or none) shaping on, restoring the previous
    shaping on any failure, then arm the commit-confirm timer when asked. With `dry_run` only the tc lines.
    Returns the result `python -m shaping apply --json` prints."""
    lockout.check_mgmt_addresses(list(req.mgmt_addr))
    shape = req.shape
    peers = req.peers
    classify.check(shape.qdisc, peers)
    dev = req.dev
    if req.confirm_within is not None:
        commit_confirm.check_within(req.confirm_within)
    mode = highrate.check_mode(req.offload)
    offload = mode != "off" and highrate.resolve_offload(mode, highrate.nic_offload_state(dev, req.netns), dev)
    if offload and req.ingress and mode == "auto":  # auto: offload where it can; with an ifb redirect it cannot
        print(f"note: --offload auto with --ingress on {dev}: software htb (an ingress redirect excludes offload)",
              file=sys.stderr)  # fmt: skip
        offload = False
    if offload and req.ingress:
        raise InputError(
            "--offload with --ingress: the offload classifier (clsact) and the ingress redirect share the NIC's "
            "ingress hook, and an ifb cannot be offloaded; shape egress only on every host (each peer flow leaves "
            "a shaped NIC)"
        )
    if offload:
        highrate.render_offload(dev, shape, peers, req.netns)  # refuses tbf and netem before anything changes
    warnings = highrate.warnings_for(shape, offload=offload, ingress=bool(req.ingress))
    for line in warnings:
        print(line, file=sys.stderr)
    if req.dry_run:
        if offload:
            return {"dev": dev, "dry_run": True, "commands": highrate.render_offload(dev, shape, peers, req.netns),
                    "plan": shape.to_dict(), "peers": list(peers), "classifier": classify.describe(peers),
                    "offload": True, "warnings": warnings}  # fmt: skip
        lines = render_tc(dev, shape, req.netns, peers)
        lines += render_ingress(dev, shape, req.netns, peers) if req.ingress else []
        return {"dev": dev, "dry_run": True, "commands": lines, "plan": shape.to_dict(), "peers": list(peers),
                "classifier": classify.describe(peers)}  # fmt: skip
    lockout.check_lockout(dev, netns=req.netns, force_mgmt_iface=req.force_mgmt_iface, mgmt_addresses=list(req.mgmt_addr))
    previous = commit_confirm.snapshot(dev, netns=req.netns)  # also: InputError if dev is missing
    want_ingress = bool(req.ingress)
    same = (
        shape.matches(previous["egress"])
        and tuple(previous["egress"].get("peers") or ()) == peers
        and (
            (
                previous["ingress"]["active"]
                and shape.matches(previous["ingress"]["shaping"])
                and tuple(previous["ingress"].get("peers") or ()) == peers
            )
            if want_ingress
            else not previous["ingress"]["active"]
        )
    )
    result: dict[str, Any] = {
        "dev": dev,
        "netns": req.netns,
        "changed": not same,
        "egress": shape.to_dict(),
        "ingress": shape.to_dict() if want_ingress else None,
        "peers": list(peers),
        "classifier": classify.describe(peers),
        "offload": offload,
        "warnings": warnings,
        "confirm": None,
    }
    if same and not offload:
        return result
    try:
        if offload:
            result["egress"] = _apply_offload(dev, shape, peers, req)
        else:
            result["egress"] = tc.apply(dev, shape, netns=req.netns, force=req.force, peers=peers)
        if want_ingress:
            result["ingress"] = ingress.apply(dev, shape, netns=req.netns, force=req.force, peers=peers)
        else:
            ingress.clear(dev, netns=req.netns)
    except TestbedError as e:
        try:
            commit_confirm.restore(dev, previous, netns=req.netns)
        except TestbedError as again:
            raise ShapingError(f"{e}; restoring the previous shaping of {dev} failed too: {again}") from None
        raise
    if req.confirm_within is not None:
        result["confirm"] = commit_confirm.arm(
            dev, previous, result, req.confirm_within, netns=req.netns, base=req.state_dir
        )
    return result


def _apply_offload(dev: str, shape: LinkShape, peers: classify.Peers, req: ApplyRequest) -> dict[str, Any]:
    """HTB offload through the host's own ethtool and tc (pyroute2 0.9 cannot set TCA_HTB_OFFLOAD): the rendered
    lines, run in order; a failing line raises (the caller restores the previous shaping), then read back."""
    import shlex

    shown = tc.show(dev, netns=req.netns)
    if shown["ownership"] == "foreign" and not req.force:
        raise tc.ForeignQdiscError(f"{dev} has a root qdisc the testbed did not create ({shown['qdisc']}); pass --force")
    for line in highrate.render_offload(dev, shape, peers, req.netns):
        done = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            tc.clear_offload_classifier(dev, netns=req.netns)
            raise ShapingError(f"HTB offload on {dev}: `{line}` failed: {done.stderr.strip() or done.returncode}")
    return {**tc.show(dev, netns=req.netns), "offload": True}


def clear(dev: str, *, netns: str | None = None, state_dir: str | None = None, forget: bool = False) -> dict[str, Any]:
    """Remove the testbed's shaping of `dev` (egress, an offload classifier, ingress) and end a pending change's
    timer; with `forget` also its commit-confirm state directory."""
    commit_confirm.check_device(dev, netns)  # before any state is touched
    cancelled = commit_confirm.cancel(dev, netns=netns, base=state_dir)
    egress = tc.clear(dev, netns=netns)
    egress = tc.clear_offload_classifier(dev, netns=netns) or egress
    ing = ingress.clear(dev, netns=netns)
    out = {"dev": dev, "netns": netns, "changed": bool(egress or ing), "cancelled_pending": cancelled}
    if forget:
        out["forgotten"] = commit_confirm.forget(dev, netns=netns, base=state_dir)
    return out


def show(dev: str, *, netns: str | None = None, state_dir: str | None = None) -> dict[str, Any]:
    """What `dev` carries now: egress, ingress and a pending (unconfirmed) change."""
    record = commit_confirm.pending(dev, netns=netns, base=state_dir)
    return {
        "dev": dev,
        "netns": netns,
        "egress": tc.show(dev, netns=netns),
        "ingress": ingress.show(dev, netns=netns),
        "pending": None
        if record is None
        else {k: record.get(k) for k in ("status", "deadline_unix", "timer_pid", "finished_unix", "error")},
    }
