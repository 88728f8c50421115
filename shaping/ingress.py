"""Ingress shaping on a real NIC: redirect what arrives on `ifname` to an ifb device and shape the ifb's egress.

A qdisc only shapes what leaves an interface. On emulated hosts both ends of a veth are ours, so download is shaped on
the switch side; a real NIC has no such other end, so (as `tc` users do) the testbed attaches an `ingress` qdisc
(ffff:) to the NIC, adds a u32 match-all filter whose mirred action redirects every packet to the egress of an ifb
device, and shapes that ifb with `shaping.tc.apply` (same HTB/TBF plan, same 7e57: handle).

Ownership: the ifb carries the alias ``testbed-ingress:<ifname>``, the filter has priority 0x7e57 and redirects to that
ifb. A foreign ingress/clsact qdisc or foreign ingress filters are refused unless ``force``. Every step is recorded
and undone in reverse if a later one fails, so a failed apply leaves the NIC as it was. All through pyroute2.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
from typing import Any

from pyroute2 import IPRoute, protocols
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins as _tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo

from shaping import classify, tc
from shaping.errors import PermissionDenied, ShapingError
from shaping.highrate import leaf_limit_bytes
from shaping.netns_route import interface_index, route_for
from shaping.plan import CLASS_HANDLE, OWNED_MAJOR, LinkShape

# bfifo takes the same options as pfifo (struct tc_fifo_qopt: one u32 limit, in bytes for bfifo); pyroute2 0.9 maps
# only pfifo, so teach it the byte-limited twin.
_tc_plugins.setdefault("bfifo", sched_pfifo)
LEAF_HANDLE = 0x7E59 << 16  # 7e59:, the explicit leaf under the ifb's shaped class (instead of the 32-packet default)

INGRESS_HANDLE = 0xFFFF0000  # ffff:, the only handle an ingress qdisc can have
FILTER_PRIO = OWNED_MAJOR  # 0x7e57: marks the redirect filter as the testbed's (0x7e58 too: IPv6 peers)
OUR_PRIOS = frozenset(classify.INGRESS_PRIO.values()) | {FILTER_PRIO}
IFB_ALIAS_PREFIX = "testbed-ingress:"
IFNAMSIZ = 15


def ifb_name(ifname: str) -> str:
    """Deterministic ifb name for `ifname`: ``ifb-<ifname>`` or, when that exceeds 15 chars, a hashed short form."""
    name = f"ifb-{ifname}"
    if len(name) <= IFNAMSIZ:
        return name
    return "ifb-" + hashlib.sha1(ifname.encode()).hexdigest()[:11]


def _lookup(ipr: IPRoute, ifname: str) -> int | None:
    found = ipr.link_lookup(ifname=ifname)
    return found[0] if found else None


def _ingress_qdisc(ipr: IPRoute, index: int):
    """The ingress-side qdisc of a device (ingress or clsact), or None."""
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") in ("ingress", "clsact"):
            return q
    return None


def _filters(ipr: IPRoute, index: int) -> list:
    """Filters under ffff: as (prio, kind, mirred target ifindex or None, protocol, u32 keys) tuples, one per
    filter node."""
    out = []
    try:
        msgs = ipr.get_filters(index=index, parent=INGRESS_HANDLE)
    except NetlinkError:
        return out
    for f in msgs:
        prio = f["info"] >> 16
        target = None
        opts = f.get_attr("TCA_OPTIONS")
        acts = opts.get_attr("TCA_U32_ACT") if opts is not None else None
        for slot in acts["attrs"] if acts is not None else []:
            act = slot[1]
            if act.get_attr("TCA_ACT_KIND") == "mirred":
                act_opts = act.get_attr("TCA_ACT_OPTIONS")
                parms = act_opts.get_attr("TCA_MIRRED_PARMS") if act_opts is not None else None
                if parms:
                    target = parms["ifindex"]
        protocol = socket.ntohs(f["info"] & 0xFFFF)
        out.append((prio, f.get_attr("TCA_KIND"), target, protocol, tc.u32_sel_keys(f) if target else []))
    return out


def _classifier(ours: list) -> classify.Peers | None:
    """The peers the testbed's redirect filters match by source: () for match-all, None for no redirect."""
    if not ours:
        return None
    by_prio = {prio: version for version, prio in classify.INGRESS_PRIO.items()}
    cidrs = []
    for prio, _kind, _target, protocol, keys in ours:
        if protocol == protocols.ETH_P_ALL:
            return ()
        version = by_prio.get(prio)
        cidr = classify.cidr_from_keys(keys, version, "src") if version and keys else None
        if cidr:
            cidrs.append(cidr)
    return classify.parse_peers(cidrs) if cidrs else None


def _ifb_owned(ipr: IPRoute, ifname: str) -> int | None:
    """Index of the testbed's ifb for `ifname`, or None. Raises if the name is taken by something else."""
    name = ifb_name(ifname)
    index = _lookup(ipr, name)
    if index is None:
        return None
    link = ipr.get_links(index)[0]
    info = link.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    alias = link.get_attr("IFLA_IFALIAS")
    if kind != "ifb" or alias != IFB_ALIAS_PREFIX + ifname:
        raise ShapingError(
            f"interface {name} exists but is not the testbed's ifb for {ifname} (kind {kind}, alias {alias!r}); "
            "remove or rename it first"
        )
    return index


def _state(ipr: IPRoute, ifname: str, netns: str | None) -> dict[str, Any]:
    index = interface_index(ipr, ifname, netns)
    ifb_index = _ifb_owned(ipr, ifname)
    q = _ingress_qdisc(ipr, index)
    filters = _filters(ipr, index) if q is not None else []
    ours = [f for f in filters if f[0] in OUR_PRIOS and ifb_index is not None and f[2] == ifb_index]
    foreign = [f for f in filters if f[0] not in OUR_PRIOS]
    return {
        "index": index,
        "ifb_index": ifb_index,
        "qdisc": q.get_attr("TCA_KIND") if q is not None else None,
        "our_filter": bool(ours),
        "peers": _classifier(ours),
        "foreign_filters": len({f[0] for f in foreign}),
    }


def _del_redirect(ipr: IPRoute, index: int) -> None:
    """Remove the testbed's redirect filters (match-all or per peer), whichever are there."""
    for prio in sorted(OUR_PRIOS):
        with contextlib.suppress(NetlinkError):
            ipr.tc("del-filter", index=index, parent=INGRESS_HANDLE, prio=prio, protocol=0)


def _add_redirect(ipr: IPRoute, index: int, ifb_index: int, peers: classify.Peers) -> None:
    """Redirect what arrives from `peers` (by source address; () for every packet) to the ifb."""
    action = {"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb_index}
    if not peers:
        ipr.tc("add-filter", "u32", index, parent=INGRESS_HANDLE, prio=FILTER_PRIO, protocol=protocols.ETH_P_ALL,
               target=0x1, keys=["0x0/0x0+0"], action=action)  # fmt: skip
        return
    for cidr in peers:
        version = classify.version_of(cidr)
        ipr.tc("add-filter", "u32", index, parent=INGRESS_HANDLE, prio=classify.INGRESS_PRIO[version],
               protocol=classify.PROTOCOL[version], target=0x1, keys=classify.pyroute2_keys(cidr, "src"),
               action=action)  # fmt: skip


def apply(
    ifname: str,
    shape: LinkShape,
    *,
    netns: str | None = None,
    force: bool = False,
    peers: classify.Peers = (),
) -> dict[str, Any]:
    """Shape what arrives on `ifname` at `shape` via its ifb: every packet, or with `peers` (CIDRs) only what comes
    from them (the rest is not redirected, so not shaped). Idempotent; rolled back on partial failure."""
    where = f"{netns}/{ifname}" if netns else ifname
    undo: list[tuple[str, Any]] = []
    with route_for(netns, "ingress shaping") as ipr:
        st = _state(ipr, ifname, netns)
        index = st["index"]
        foreign_q = st["qdisc"] == "clsact" or (st["qdisc"] == "ingress" and not st["our_filter"])
        if (foreign_q or st["foreign_filters"]) and not force:
            raise tc.ForeignQdiscError(
                f"{where} already has an ingress {st['qdisc']} qdisc with filters the testbed did not create; "
                "refusing to replace it. Pass --force to replace it (it is not restored by clear)"
            )
        try:
            if foreign_q:  # forced: drop the foreign ingress/clsact qdisc and everything under it
                ipr.tc("del", index=index, handle=INGRESS_HANDLE, parent=0xFFFFFFF1)
                st["qdisc"] = None
            ifb_index = st["ifb_index"]
            if ifb_index is None:  # as many queues as the NIC, so the redirect does not funnel into one
                queues = nic_tx_queues(ipr, index)
                ipr.link("add", ifname=ifb_name(ifname), kind="ifb", num_tx_queues=queues, num_rx_queues=queues)
                ifb_index = interface_index(ipr, ifb_name(ifname), netns)
                undo.append(("link", ifb_index))
                ipr.link("set", index=ifb_index, ifalias=IFB_ALIAS_PREFIX + ifname)
            ipr.link("set", index=ifb_index, state="up")
            if st["qdisc"] is None:
                ipr.tc("add", "ingress", index, INGRESS_HANDLE)
                undo.append(("qdisc", index))
            if not st["our_filter"] or st["peers"] != tuple(peers):
                if st["our_filter"]:
                    _del_redirect(ipr, index)
                undo.append(("redirect", (index, ifb_index, st["peers"] if st["our_filter"] else None)))
                _add_redirect(ipr, index, ifb_index, tuple(peers))
            plan = tc.apply(ifb_name(ifname), shape, netns=netns, force=False)
            leaf = None
            if shape.qdisc == "htb" and not shape.needs_netem:  # netem, when asked for, is the leaf itself
                leaf = leaf_limit_bytes(shape.rate_bps, shape.effective_burst_bytes)
                ipr.tc("replace", "bfifo", ifb_index, LEAF_HANDLE, parent=CLASS_HANDLE, limit=leaf)
        except (NetlinkError, ShapingError) as e:
            _undo(ipr, undo)
            if isinstance(e, ShapingError):
                raise
            if e.code == errno.EPERM:
                raise PermissionDenied(f"ingress shaping on {where}: needs root or CAP_NET_ADMIN") from None
            if e.code in (errno.EOPNOTSUPP, errno.ENOENT):
                raise ShapingError(
                    f"ingress shaping on {where}: the kernel lacks a piece it needs (ifb, sch_ingress, cls_u32 or "
                    f"act_mirred): {os.strerror(e.code)}"
                ) from None
            raise ShapingError(f"ingress shaping on {where}: kernel refused ({os.strerror(e.code)})") from None
    return {**plan, "ifname": ifname, "netns": netns, "direction": "ingress", "ifb": ifb_name(ifname),
            "peers": list(peers), "leaf_limit_bytes": leaf}  # fmt: skip


def nic_tx_queues(ipr: IPRoute, index: int) -> int:
    """The NIC's number of TX queues (IFLA_NUM_TX_QUEUES), at least 1."""
    link = ipr.get_links(index)[0]
    return max(1, int(link.get_attr("IFLA_NUM_TX_QUEUES") or 1))


def _undo(ipr: IPRoute, undo: list[tuple[str, Any]]) -> None:
    for what, index in reversed(undo):
        with contextlib.suppress(NetlinkError):
            if what == "link":
                ipr.link("del", index=index)
            elif what == "qdisc":
                ipr.tc("del", index=index, handle=INGRESS_HANDLE, parent=0xFFFFFFF1)
            elif what == "redirect":  # put back the redirect that was there (or none)
                nic, ifb_index, previous = index
                _del_redirect(ipr, nic)
                if previous is not None:
                    _add_redirect(ipr, nic, ifb_index, previous)


def clear(ifname: str, *, netns: str | None = None) -> bool:
    """Remove the testbed's ingress redirect and ifb from `ifname`. Idempotent. True if anything changed."""
    changed = False
    with route_for(netns, "ingress shaping") as ipr:
        st = _state(ipr, ifname, netns)
        index = st["index"]
        try:
            if st["our_filter"]:
                if st["qdisc"] == "ingress" and not st["foreign_filters"]:
                    ipr.tc("del", index=index, handle=INGRESS_HANDLE, parent=0xFFFFFFF1)
                else:
                    _del_redirect(ipr, index)
                changed = True
            if st["ifb_index"] is not None:
                ipr.link("del", index=st["ifb_index"])
                changed = True
        except NetlinkError as e:
            raise ShapingError(
                f"clearing ingress shaping on {ifname}: kernel refused ({os.strerror(e.code)})"
            ) from None
    return changed


def show(ifname: str, *, netns: str | None = None) -> dict[str, Any]:
    """Ingress state of `ifname`: whether the testbed's redirect is active and the shaping read back from its ifb."""
    with route_for(netns, "ingress shaping") as ipr:
        st = _state(ipr, ifname, netns)
    active = st["our_filter"] and st["ifb_index"] is not None
    return {
        "ifname": ifname,
        "netns": netns,
        "direction": "ingress",
        "ifb": ifb_name(ifname),
        "active": active,
        "qdisc": st["qdisc"],
        "foreign_filters": st["foreign_filters"],
        "peers": list(st["peers"] or ()),
        "shaping": tc.show(ifb_name(ifname), netns=netns) if st["ifb_index"] is not None else None,
    }
