"""Apply, read back and clear a LinkShape on one interface through pyroute2 (no `tc` binary).

Ownership rules (FIELD_NOTES): the testbed's root qdisc carries the handle 7e57:. A root qdisc the kernel put there by
default (handle 0:, e.g. noqueue on veth, pfifo_fast, mq) is replaced freely and comes back when ours is deleted.
Any other root qdisc is foreign: `apply` refuses it unless `force=True`, in which case its whole tree (qdiscs and
classes) is saved as netlink messages and replayed by `clear`. A failure halfway rolls back to what was there.
Works on an emulated host's veth inside a namespace and on a real NIC in the root namespace alike.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

from shaping import classify
from shaping.errors import PermissionDenied, ShapingError
from shaping.files import atomic_write
from shaping.netns_route import interface_index, route_for
from shaping.plan import (
    CLASS_HANDLE,
    NETEM_HANDLE,
    OWNED_MAJOR,
    ROOT_HANDLE,
    TBF_LATENCY_S,
    UNSHAPED_HANDLE,
    LinkShape,
    unshaped_class_shape,
)

TC_H_ROOT = 0xFFFFFFFF
_REPLAYED_ATTRS = {"TCA_KIND", "TCA_OPTIONS", "TCA_RATE", "TCA_STAB"}  # what the kernel takes on create


class ForeignQdiscError(ShapingError):
    """The interface has a root qdisc the testbed did not create; nothing was changed."""

    exit_code = 2


DEFAULT_STATE_DIR = Path("/run/testbed")  # the host-side default; the controller passes its own state directory


def backup_dir(state_dir: str | Path | None = None) -> Path:
    """Where foreign qdisc trees replaced with force are saved: `<state_dir>/qdisc-backup`."""
    return Path(state_dir or DEFAULT_STATE_DIR) / "qdisc-backup"


def _backup_path(ifname: str, netns: str | None, state_dir: str | Path | None) -> Path:
    return backup_dir(state_dir) / f"{netns or '_root'}__{ifname}.json"


def _root(ipr: IPRoute, index: int):
    for q in ipr.get_qdiscs(index=index):
        if q["parent"] == TC_H_ROOT:
            return q
    return None


def _del_root(ipr: IPRoute, index: int, handle: int) -> None:
    """Delete a root qdisc by handle, whatever its kind (the kernel rejects a kind that does not match)."""
    ipr.tc("del", index=index, handle=handle, parent=TC_H_ROOT)


def _ownership(root) -> str:
    """'owned' (ours), 'default' (the kernel's own, handle 0:) or 'foreign'."""
    if root is None or root["handle"] == 0:
        return "default"
    if root["handle"] >> 16 == OWNED_MAJOR:
        return "owned"
    return "foreign"


def _netlink_fail(action: str, ifname: str, err: NetlinkError) -> ShapingError:
    if err.code == errno.EPERM:
        return PermissionDenied(f"{action} on {ifname}: needs root or CAP_NET_ADMIN")
    return ShapingError(f"{action} on {ifname}: kernel refused ({os.strerror(err.code)})")


def _add_netem(ipr: IPRoute, index: int, ifname: str, shape: LinkShape) -> None:
    try:
        ipr.tc(
            "replace",
            "netem",
            index,
            NETEM_HANDLE,
            parent=CLASS_HANDLE,
            delay=shape.delay_s * 1e6,
            jitter=shape.jitter_s * 1e6,
            loss=shape.loss_pct,
        )
    except NetlinkError as e:
        if e.code == errno.ENOENT:
            raise ShapingError(
                f"--delay/--jitter/--loss on {ifname} need the netem qdisc (sch_netem), which this kernel lacks; "
                "shape the rate only, or use a kernel with CONFIG_NET_SCH_NETEM"
            ) from None
        raise _netlink_fail("adding netem", ifname, e) from None


def u32_sel_keys(msg) -> list[tuple[int, int, int]]:
    """(value, mask, offset) keys of a u32 filter message, read from the raw TCA_U32_SEL (see classify)."""
    opts = msg.get_attr("TCA_OPTIONS")
    for slot in opts["attrs"] if opts is not None else []:
        if slot[0] == "TCA_U32_SEL":
            cell = slot.cell[1]
            return classify.decode_u32_sel(bytes(cell.data[cell.offset + 4 : cell.offset + cell.length]))
    return []


def read_peers(ipr: IPRoute, index: int) -> classify.Peers:
    """The peers classifier under the testbed's htb root: the CIDRs its filters send to the shaped class."""
    by_prio = {prio: version for version, prio in classify.EGRESS_PRIO.items()}
    found = []
    try:
        msgs = ipr.get_filters(index=index, parent=ROOT_HANDLE)
    except NetlinkError:
        return ()
    for f in msgs:
        version = by_prio.get(f["info"] >> 16)
        keys = u32_sel_keys(f) if version else []
        cidr = classify.cidr_from_keys(keys, version, "dst") if keys else None
        if cidr:
            found.append(cidr)
    return classify.parse_peers(found) if found else ()


def _set_peer_filters(ipr: IPRoute, index: int, peers: classify.Peers) -> None:
    """Make the filters under 7e57: exactly `peers` -> 7e57:1 (none: every packet takes the default class)."""
    for version, prio in classify.EGRESS_PRIO.items():
        with contextlib.suppress(NetlinkError):
            ipr.tc("del-filter", index=index, parent=ROOT_HANDLE, prio=prio, protocol=classify.PROTOCOL[version])
    for cidr in peers:
        _add_peer_filter(ipr, index, cidr)


def _add_peer_filter(ipr: IPRoute, index: int, cidr: str) -> None:
    version = classify.version_of(cidr)
    ipr.tc(
        "add-filter",
        "u32",
        index,
        parent=ROOT_HANDLE,
        prio=classify.EGRESS_PRIO[version],
        protocol=classify.PROTOCOL[version],
        target=CLASS_HANDLE,
        keys=classify.pyroute2_keys(cidr, "dst"),
    )


def _htb_default(root) -> int | None:
    opts = root.get_attr("TCA_OPTIONS") if root is not None else None
    init = opts.get_attr("TCA_HTB_INIT") if opts is not None else None
    return init["defcls"] if init else None


def _htb_class(ipr: IPRoute, index: int, handle: int, shape: LinkShape) -> None:
    rate_bytes_s = shape.rate_bps / 8
    burst = shape.effective_burst_bytes
    ipr.tc(
        "replace-class",
        "htb",
        index,
        handle,
        parent=ROOT_HANDLE,
        rate=rate_bytes_s,
        ceil=rate_bytes_s,
        burst=burst,
        cburst=burst,
        quantum=shape.quantum_bytes,
    )


def _apply_rate(
    ipr: IPRoute,
    index: int,
    ifname: str,
    shape: LinkShape,
    existing_kind: str | None,
    existing_default: int | None = None,
    peers: classify.Peers = (),
) -> None:
    rate_bytes_s = shape.rate_bps / 8
    burst = shape.effective_burst_bytes
    want_default = (UNSHAPED_HANDLE if peers else CLASS_HANDLE) & 0xFFFF
    if existing_kind is not None and (
        existing_kind != shape.qdisc or (shape.qdisc == "htb" and existing_default != want_default)
    ):  # htb cannot change its default class in place: a classifier added or removed means a new root
        _del_root(ipr, index, ROOT_HANDLE)
        existing_kind = None
    if shape.qdisc == "htb":
        if existing_kind != "htb":  # htb cannot "change" its root in place: keep it and replace the class
            ipr.tc("replace", "htb", index, ROOT_HANDLE, default=want_default)
        _htb_class(ipr, index, CLASS_HANDLE, shape)
        if peers:
            _htb_class(ipr, index, UNSHAPED_HANDLE, unshaped_class_shape())
        if peers or existing_kind == "htb":
            _set_peer_filters(ipr, index, peers)
    else:
        ipr.tc("replace", "tbf", index, ROOT_HANDLE, rate=rate_bytes_s, burst=burst, latency=TBF_LATENCY_S * 1e6)


def apply(
    ifname: str,
    shape: LinkShape,
    *,
    netns: str | None = None,
    force: bool = False,
    state_dir: str | Path | None = None,
    peers: classify.Peers = (),
) -> dict[str, Any]:
    """Shape the egress of `ifname` (in `netns`, or the root namespace) and return what was applied. A foreign root
    replaced with `force` is saved under `backup_dir(state_dir)` for `clear` to put back. With `peers` (CIDRs) only
    traffic to them is shaped; the rest takes an unshaped default class (see shaping/classify.py)."""
    classify.check(shape.qdisc, peers)
    with route_for(netns, "shaping") as ipr:
        index = interface_index(ipr, ifname, netns)
        root = _root(ipr, index)
        owner = _ownership(root)
        where = f"{netns}/{ifname}" if netns else ifname
        if owner == "foreign" and not force:
            raise ForeignQdiscError(
                f"{where} has a root qdisc the testbed did not create ({root.get_attr('TCA_KIND')} "
                f"{root['handle'] >> 16:x}:); refusing to replace it. Pass --force to replace it (it is saved and "
                "restored by --clear/down)"
            )
        saved = False
        previous = _dump_tree(ipr, index) if owner == "owned" else []
        previous_peers = read_peers(ipr, index) if owner == "owned" else ()
        try:
            if owner == "foreign":
                _save_tree(ipr, index, ifname, netns, state_dir)
                saved = True
                _del_root(ipr, index, root["handle"])
            existing_kind = root.get_attr("TCA_KIND") if owner == "owned" else None
            if owner == "owned" and not shape.needs_netem:
                with contextlib.suppress(NetlinkError):
                    ipr.tc("del", index=index, handle=NETEM_HANDLE, parent=CLASS_HANDLE)
            existing_default = _htb_default(root) if existing_kind == "htb" else None
            _apply_rate(ipr, index, ifname, shape, existing_kind, existing_default, peers)
            if shape.needs_netem:
                _add_netem(ipr, index, ifname, shape)
        except (NetlinkError, ShapingError) as e:
            _rollback(ipr, index, ifname, netns, restore=saved, previous=previous, state_dir=state_dir,
                      previous_peers=previous_peers)  # fmt: skip
            if isinstance(e, ShapingError):
                raise
            raise _netlink_fail(f"shaping {shape.describe()}", where, e) from None
    return {"ifname": ifname, "netns": netns, "replaced_foreign": saved, **shape.to_dict(), "peers": list(peers)}


def _rollback(
    ipr: IPRoute,
    index: int,
    ifname: str,
    netns: str | None,
    restore: bool,
    previous: list[dict],
    state_dir: str | Path | None,
    previous_peers: classify.Peers = (),
) -> None:
    """Put back what was there before a failed apply: our previous shaping (classifier included), or the saved
    foreign tree."""
    if _ownership(_root(ipr, index)) == "owned":
        with contextlib.suppress(NetlinkError):
            _del_root(ipr, index, ROOT_HANDLE)
    if previous:
        _replay(ipr, index, ifname, previous, where_saved="(in memory)")
        try:
            for cidr in previous_peers:  # filters are not part of the dumped tree: put the classifier back too
                _add_peer_filter(ipr, index, cidr)
        except NetlinkError as e:
            raise ShapingError(f"restoring the peers classifier of {ifname} failed ({os.strerror(e.code)})") from None
    if restore:
        _restore_tree(ipr, index, ifname, netns, state_dir)


def clear(ifname: str, *, netns: str | None = None, state_dir: str | Path | None = None) -> bool:
    """Remove the testbed's root qdisc and restore what was there before (saved under `backup_dir(state_dir)`).
    Idempotent. True if anything changed."""
    with route_for(netns, "shaping") as ipr:
        index = interface_index(ipr, ifname, netns)
        root = _root(ipr, index)
        changed = False
        if _ownership(root) == "owned":
            try:
                _del_root(ipr, index, ROOT_HANDLE)
            except NetlinkError as e:
                raise _netlink_fail("clearing shaping", ifname, e) from None
            changed = True
        if _backup_path(ifname, netns, state_dir).exists() and _ownership(_root(ipr, index)) == "default":
            _restore_tree(ipr, index, ifname, netns, state_dir)
            changed = True
        return changed


def clear_offload_classifier(ifname: str, *, netns: str | None = None) -> bool:
    """Remove the clsact qdisc that HTB offload's classifier (shaping.highrate) added, when every filter on it is
    the testbed's (priority 0x7e57, 0x7e5b, 0x7e5d). True if it was removed."""
    from shaping.highrate import SKBEDIT_PRIO

    ours = {SKBEDIT_PRIO, SKBEDIT_PRIO + 4, SKBEDIT_PRIO + 6}
    with route_for(netns, "shaping") as ipr:
        index = interface_index(ipr, ifname, netns)
        if not any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
            return False
        prios = set()
        for parent in (0xFFFFFFF2, 0xFFFFFFF3):  # clsact's ingress and egress hooks
            with contextlib.suppress(NetlinkError):
                prios |= {f["info"] >> 16 for f in ipr.get_filters(index=index, parent=parent)}
        if not prios or not prios <= ours:
            return False
        try:
            ipr.tc("del", index=index, handle=0xFFFF0000, parent=0xFFFFFFF1)
        except NetlinkError as e:
            raise _netlink_fail("clearing the offload classifier", ifname, e) from None
        return True


def _dump_tree(ipr: IPRoute, index: int) -> list[dict]:
    """The egress qdisc tree of an interface as plain netlink messages, parents before children."""
    messages = []
    for kind, dump in (("qdisc", ipr.get_qdiscs(index=index)), ("class", ipr.get_classes(index=index))):
        for msg in dump:
            if msg.get_attr("TCA_KIND") in ("ingress", "clsact"):
                continue  # not part of the egress root tree
            plain = msg.dump()
            plain.pop("header", None)
            plain["attrs"] = [a for a in plain["attrs"] if a[0] in _REPLAYED_ATTRS]
            _fix_dumped_options(plain)
            messages.append({"kind": kind, "msg": plain})
    return _parents_first(messages)


def _parents_first(messages: list[dict]) -> list[dict]:
    """Order qdiscs and classes so that each one's parent is created before it (a leaf qdisc under an htb class,
    netem under 7e57:1, nested htb classes): the root qdisc, then whatever hangs off what already exists."""

    def needs(m: dict) -> int | None:
        handle, parent = m["msg"]["handle"], m["msg"]["parent"]
        if parent == TC_H_ROOT:  # a root qdisc needs nothing; a top-level class needs its qdisc (major:0)
            return None if m["kind"] == "qdisc" else handle & 0xFFFF0000
        return parent  # a class X:Y or a qdisc X:0 (qdisc and class handles never collide)

    ordered: list[dict] = []
    made: set[int] = set()
    pending = sorted(messages, key=lambda m: (m["kind"] != "qdisc", m["msg"]["parent"] != TC_H_ROOT))
    while pending:
        ready = [m for m in pending if needs(m) is None or needs(m) in made]
        if not ready:  # a parent missing from the dump: keep the rest in order, let the kernel say what is wrong
            ordered += pending
            break
        for m in ready:
            ordered.append(m)
            made.add(m["msg"]["handle"])
        pending = [m for m in pending if m not in ready]
    return ordered


def _save_tree(ipr: IPRoute, index: int, ifname: str, netns: str | None, state_dir: str | Path | None) -> None:
    """Save a foreign qdisc tree to the backup file that `clear` replays."""
    messages = _dump_tree(ipr, index)
    path = _backup_path(ifname, netns, state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(messages))


def _fix_dumped_options(plain: dict) -> None:
    """Where a dump does not read back as a create request, fix it (htb dumps version 0x30011, wants 3)."""
    for name, value in plain["attrs"]:
        if name == "TCA_OPTIONS" and isinstance(value, dict):
            for opt_name, opt in value.get("attrs", []):
                if opt_name == "TCA_HTB_INIT" and opt.get("version", 0) > 0xFFFF:
                    opt["version"] >>= 16


def _restore_tree(ipr: IPRoute, index: int, ifname: str, netns: str | None, state_dir: str | Path | None) -> None:
    path = _backup_path(ifname, netns, state_dir)
    _replay(ipr, index, ifname, json.loads(path.read_text()), where_saved=str(path))
    path.unlink()


def _replay(ipr: IPRoute, index: int, ifname: str, messages: list[dict], where_saved: str) -> None:
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    for m in messages:
        msg = tcmsg()
        msg.load(m["msg"])
        msg["index"] = index  # the ifindex may differ if the device was re-created
        try:
            msg_type = RTM_NEWQDISC if m["kind"] == "qdisc" else RTM_NEWTCLASS
            # IPRoute.nlm_request() of pyroute2 0.9.7 trips over a missing status key; use the generator it wraps
            tuple(ipr._generate_with_cleanup(ipr.asyncore.nlm_request, msg, msg_type, flags, None, None, None))  # noqa: SLF001
        except NetlinkError as e:
            if e.code == errno.EEXIST and m["kind"] == "class":
                continue  # classes a classful qdisc makes by itself (tbf 1:1) are back already
            raise ShapingError(
                f"restoring the saved qdisc tree of {ifname} failed ({os.strerror(e.code)}); saved copy: {where_saved}"
            ) from None


def _rate_from_class(opts) -> tuple[int, int]:
    parms = opts.get_attr("TCA_HTB_PARMS")
    rate_bytes = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
    return rate_bytes * 8, _ticks_to_bytes(parms["buffer"], rate_bytes)


def _ticks_to_bytes(ticks: int, rate_bytes_s: float) -> int:
    return int(round(ticks / tick_in_usec * rate_bytes_s / 1e6))


def show(ifname: str, *, netns: str | None = None) -> dict[str, Any]:
    """Read back the root qdisc of `ifname`: kind, ownership, rate, burst, netem, and byte/drop counters."""
    with route_for(netns, "shaping") as ipr:
        index = interface_index(ipr, ifname, netns)
        root = _root(ipr, index)
        out: dict[str, Any] = {
            "ifname": ifname,
            "netns": netns,
            "qdisc": None,
            "owned": False,
            "ownership": _ownership(root),
            "rate_bps": None,
            "burst_bytes": None,
            "netem": None,
            "peers": [],
            "sent_bytes": 0,
            "sent_packets": 0,
            "drops": 0,
            "overlimits": 0,
        }
        if root is None:
            return out
        kind = root.get_attr("TCA_KIND")
        out["qdisc"] = kind
        out["owned"] = out["ownership"] == "owned"
        stats = root.get_attr("TCA_STATS") or {}
        out.update(
            sent_bytes=stats.get("bytes", 0),
            sent_packets=stats.get("packets", 0),
            drops=stats.get("drop", 0),
            overlimits=stats.get("overlimits", 0),
        )
        opts = root.get_attr("TCA_OPTIONS")
        if kind == "tbf" and opts is not None:
            parms = opts.get_attr("TCA_TBF_PARMS")
            rate_bytes = opts.get_attr("TCA_TBF_RATE64") or parms["rate"]
            out["rate_bps"], out["burst_bytes"] = rate_bytes * 8, _ticks_to_bytes(parms["buffer"], rate_bytes)
        elif kind == "htb":
            if out["owned"]:
                out["peers"] = list(read_peers(ipr, index))
            for cls in ipr.get_classes(index=index):
                if cls["handle"] == CLASS_HANDLE or (not out["owned"] and cls["parent"] in (root["handle"], TC_H_ROOT)):
                    out["rate_bps"], out["burst_bytes"] = _rate_from_class(cls.get_attr("TCA_OPTIONS"))
                    break
        for q in ipr.get_qdiscs(index=index):
            if q.get_attr("TCA_KIND") == "netem":
                o = q.get_attr("TCA_OPTIONS")
                out["netem"] = {
                    "delay_s": o["delay"] / tick_in_usec / 1e6,
                    "jitter_s": o["jitter"] / tick_in_usec / 1e6,
                    "loss_pct": o["loss"] / (2**32 - 1) * 100,
                }
        return out
