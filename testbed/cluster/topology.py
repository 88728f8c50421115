"""Racks on the local cluster (issue 36): `testbed up --hosts 8 --racks 2 --uplink 4gbit`.

With racks, each rack has a switch namespace `tb-<cluster>-r<j>` (bridge `br0`) that its hosts' veths join, and the
racks are joined through the spine: the switch namespace `tb-<cluster>-sw` (bridge `br0`) with one veth per rack,
`sw:r<j>` <-> `r<j>:up`. Both ends of every uplink are shaped at the uplink rate, so the spine is shaped in both
directions; the hosts' links are shaped as without racks (host side upload, rack side download):

    h0:eth0 ==veth== r0:h0 --+
    h1:eth0 ==veth== r0:h1 --+-- br0 (r0) -- r0:up ==uplink== sw:r0 --+-- br0 (sw, the spine)
    h2:eth0 ==veth== r1:h2 --+-- br0 (r1) -- r1:up ==uplink== sw:r1 --+
    h3:eth0 ==veth== r1:h3 --+

Hosts are placed in racks in order (h0..h(k-1) in r0, ...): ranks follow host order, so a ring crosses the spine
twice per step with two racks (r0 -> r1 and back), once in each direction of each uplink.
Oversubscription = sum of a rack's host rates / its uplink rate.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from shaping import tc
from shaping.plan import LinkShape
from shaping.units import format_rate
from testbed.cluster import registry
from testbed.cluster.base import oversubscription as base_oversubscription
from testbed.cluster.base import rack_members
from testbed.errors import ClusterError, InputError

UPLINK_IFACE = "up"  # the rack switch's end of its uplink


def rack_ns(cluster: str, rack: int) -> str:
    return f"tb-{cluster}-r{rack}"


def check_racks(n_hosts: int, racks: int | None, uplink_bps: int | None) -> int:
    """--racks and --uplink: InputError (exit 2, nothing made) unless racks divide the hosts and the uplink is a rate."""
    r = 1 if racks is None else racks
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise InputError(f"--racks {racks!r}: expected an integer >= 1")
    if n_hosts % r:
        raise InputError(f"--racks {r} does not divide --hosts {n_hosts}: every rack holds the same number of hosts")
    if uplink_bps is not None and r == 1:
        raise InputError("--uplink needs --racks 2 or more: with one rack there is no spine")
    if uplink_bps is not None and (isinstance(uplink_bps, bool) or not isinstance(uplink_bps, int) or uplink_bps <= 0):
        raise InputError(f"--uplink {uplink_bps!r}: expected a rate > 0, e.g. 4gbit")
    return r


def racks_record(name: str, n_hosts: int, racks: int, uplink_bps: int | None) -> dict[str, Any] | None:
    """What the cluster record says of its racks (None: one flat switch, as before issue 36)."""
    if racks == 1:
        return None
    return {"count": racks, "uplink_bps": uplink_bps, "members": rack_members(n_hosts, racks),
            "namespaces": [rack_ns(name, j) for j in range(racks)]}  # fmt: skip


def rack_of_host(record: dict[str, Any]) -> dict[str, int]:
    racks = record.get("racks") or {}
    return {h: j for j, members in enumerate(racks.get("members") or []) for h in members}


def oversubscription(record: dict[str, Any], host_rate_bps: int | None) -> float | None:
    """The worst rack's sum of host rates over its uplink, every host at `host_rate_bps` (None: no racks, unshaped
    hosts or an unshaped spine)."""
    racks = record.get("racks") or {}
    members = racks.get("members") or []
    return base_oversubscription(members, {h: host_rate_bps or None for m in members for h in m},
                                 racks.get("uplink_bps"))  # fmt: skip


def describe(record: dict[str, Any], host_rate_bps: int | None) -> str | None:
    """One line for `status`: racks, uplink and oversubscription."""
    racks = record.get("racks")
    if not racks:
        return None
    up = format_rate(racks["uplink_bps"]) if racks.get("uplink_bps") else "unshaped"
    over = oversubscription(record, host_rate_bps)
    ratio = f"oversubscription {over:g}:1" if over is not None else "oversubscription undefined (unshaped links)"
    sizes = "/".join(str(len(m)) for m in racks["members"])
    return f"{racks['count']} racks of {sizes} hosts, spine uplink {up} each direction, {ratio}"


NETNS_CREATE_TRIES = 3


def create_namespace(name: str) -> None:
    """`pyroute2.netns.create`, tried again when it fails. It creates /run/netns/NAME, then bind-mounts the new
    namespace on it in a child process; under parallel namespace churn (the suite's workers creating and removing
    theirs at once) that mount failed once in a full suite (2026-12-04), surfacing as "[Errno 17] File exists" (a
    stale errno), and it leaves the empty file behind, which makes every later create of the name fail. The name is
    the caller's own (checked free, noted as building), so what a failed attempt left is removed before the next."""
    from pyroute2 import netns

    for attempt in range(1, NETNS_CREATE_TRIES + 1):
        try:
            netns.create(name)
            return
        except OSError as e:
            if attempt == NETNS_CREATE_TRIES:
                raise ClusterError(f"could not create network namespace {name} ({NETNS_CREATE_TRIES} tries): {e}") from e
            with contextlib.suppress(OSError):
                netns.remove(name)


def build_racks(ipr_spine, record: dict[str, Any], mark: str) -> None:
    """Create the rack switches and their uplinks to the spine bridge (`ipr_spine`: an IPRoute in the spine namespace,
    whose `br0` exists). Hosts join their rack's bridge afterwards (`local._build`)."""
    from shaping.netns_route import open_route

    spine_br = ipr_spine.link_lookup(ifname="br0")[0]
    for j, ns in enumerate(record["racks"]["namespaces"]):
        create_namespace(ns)
        with open_route(ns) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up", ifalias=mark)
            ipr.link("add", ifname="br0", kind="bridge")
            ipr.link("set", index=ipr.link_lookup(ifname="br0")[0], state="up")
        ipr_spine.link("add", ifname=f"r{j}", kind="veth", peer={"ifname": UPLINK_IFACE, "net_ns_fd": ns})
        port = ipr_spine.link_lookup(ifname=f"r{j}")[0]
        ipr_spine.link("set", index=port, master=spine_br, state="up")
        with open_route(ns) as ipr:
            up = ipr.link_lookup(ifname=UPLINK_IFACE)[0]
            ipr.link("set", index=up, master=ipr.link_lookup(ifname="br0")[0], state="up")


def uplinks(record: dict[str, Any], spine_ns: str) -> list[tuple[str, str, str]]:
    """(rack, netns, ifname) of both ends of every uplink."""
    racks = record.get("racks") or {}
    out = []
    for j, ns in enumerate(racks.get("namespaces") or []):
        out.append((f"r{j}", ns, UPLINK_IFACE))  # rack -> spine
        out.append((f"r{j}", spine_ns, f"r{j}"))  # spine -> rack
    return out


def shape_uplinks(record: dict[str, Any], spine_ns: str) -> None:
    """Both ends of every uplink at the uplink rate (nothing when the spine is unshaped)."""
    rate = (record.get("racks") or {}).get("uplink_bps")
    if not rate:
        return
    for _, ns, ifname in uplinks(record, spine_ns):
        tc.apply(ifname, LinkShape(int(rate)), netns=ns, state_dir=registry.state_dir())


def uplink_status(record: dict[str, Any], spine_ns: str) -> list[dict[str, Any]]:
    return [{"rack": rack, "netns": ns, "ifname": ifn, **tc.show(ifn, netns=ns)} for rack, ns, ifn in
            uplinks(record, spine_ns)]  # fmt: skip


_NETEM: list[bool] = []


def netem_available() -> bool:
    """Whether this machine's kernel offers the netem qdisc (the local cluster's hosts share it): tried on a dummy
    link in a throwaway namespace, once per process."""
    if _NETEM:
        return _NETEM[0]
    from pyroute2 import netns

    from shaping.netns_route import open_route
    from shaping.plan import NETEM_HANDLE

    ns = f"tbprobe-netem-{os.getpid()}"
    ok = False
    try:
        create_namespace(ns)  # a create that failed once under namespace churn must not read as "no netem"
        with open_route(ns) as ipr:
            ipr.link("add", ifname="nt0", kind="dummy")
            idx = ipr.link_lookup(ifname="nt0")[0]
            try:
                ipr.tc("add", "netem", idx, NETEM_HANDLE, delay=1000)
                ok = True
            except Exception:  # noqa: BLE001 - any refusal means: no netem here
                ok = False
    except Exception:  # noqa: BLE001 - no namespace either (not root): netem cannot be used from here
        ok = False
    finally:
        with contextlib.suppress(Exception):
            netns.remove(ns)
    _NETEM[:] = [ok]
    return ok
