"""Which traffic a link's shaping applies to: the peers classifier (pure data, no netlink).

A lab host's data NIC carries more than the cluster's traffic (storage, the scheduler, other tenants), so shaping can
be limited to the cluster's peers: with `peers` (CIDRs) given, packets *to* a peer (egress) or *from* a peer
(ingress, before the ifb redirect) go to the shaped class and everything else to an unshaped default class. Without
peers every byte is shaped (the emulated cluster's links carry nothing else), through the same code.

Egress layout with peers (under the testbed's htb root 7e57:, `default 2`):
    class 7e57:1  the requested rate (what LinkShape describes)
    class 7e57:2  unshaped: rate = ceil = UNSHAPED_RATE_BPS (the project's maximum rate, far above any NIC here)
    u32 filters   prio 1 (IPv4) / prio 2 (IPv6): `match ip dst CIDR` / `match ip6 dst CIDR` -> flowid 7e57:1
Ingress with peers: the u32 redirect filters to the ifb match `ip src CIDR` (prio 0x7e57, IPv4) and `ip6 src CIDR`
(prio 0x7e58, IPv6) instead of matching every packet; the ifb itself is shaped without a classifier.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable

from shaping.errors import InputError
from shaping.units import MAX_RATE_BPS

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
EGRESS_PRIO = {4: 1, 6: 2}  # filter priorities under the testbed's own htb root (all filters there are ours)
INGRESS_PRIO = {4: 0x7E57, 6: 0x7E58}  # under the NIC's ffff: ingress qdisc; 0x7e57 is also the match-all filter's
PROTOCOL = {4: ETH_P_IP, 6: ETH_P_IPV6}
UNSHAPED_RATE_BPS = MAX_RATE_BPS  # the unshaped class's rate: never the bottleneck of a real NIC
# Where the addresses sit in the IP header (u32 offsets): IPv4 src 12, dst 16; IPv6 src 8, dst 24.
_OFFSET = {(4, "src"): 12, (4, "dst"): 16, (6, "src"): 8, (6, "dst"): 24}
PEERS_HELP = "comma-separated addresses or CIDRs, e.g. 10.1.0.2,10.1.0.3 or 10.1.0.0/24"

Peers = tuple[str, ...]


def parse_peers(value: str | Iterable[str] | None, what: str = "--peers") -> Peers:
    """Normalised CIDRs (sorted, no duplicates) from a comma-separated string or a list; () for None. An address
    without a prefix is one host (/32, /128). InputError (one line) on an empty item or anything not a network."""
    if value is None:
        return ()
    items = [x.strip() for x in value.split(",")] if isinstance(value, str) else [str(x).strip() for x in value]
    if not items or not all(items):
        raise InputError(f"{what} {value!r}: empty item (an unset variable?); expected {PEERS_HELP}")
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise InputError(f"{what} {item!r}: not an address or CIDR; expected {PEERS_HELP}") from None
    unique = sorted(set(nets), key=lambda n: (n.version, int(n.network_address), n.prefixlen))
    return tuple(str(n) for n in unique)


def check(qdisc: str, peers: Peers) -> None:
    """Peers need a classful root: tbf cannot leave the other traffic unshaped."""
    if peers and qdisc != "htb":
        raise InputError(
            f"--peers with --qdisc {qdisc}: {qdisc} is classless, so it cannot leave other traffic unshaped; "
            "use --qdisc htb"
        )


def describe(peers: Peers) -> str:
    """One line for status and messages: what the shaped class matches."""
    if not peers:
        return "all traffic"
    return f"peers {', '.join(peers)} (other traffic unshaped)"


def u32_keys(cidr: str, field: str) -> list[tuple[int, int, int]]:
    """(value, mask, offset) words that match `field` ('src' or 'dst') against `cidr` in the IP header."""
    net = ipaddress.ip_network(cidr)
    base = _OFFSET[(net.version, field)]
    value = net.network_address.packed
    mask = net.netmask.packed
    keys = []
    for i in range(0, len(value), 4):
        m = struct.unpack("!I", mask[i : i + 4])[0]
        if m:
            keys.append((struct.unpack("!I", value[i : i + 4])[0], m, base + i))
    return keys or [(0, 0, base)]  # /0: one key that matches everything of this IP version


def pyroute2_keys(cidr: str, field: str) -> list[str]:
    """`u32_keys` in the spelling pyroute2's u32 filter takes: '0xVALUE/0xMASK+OFFSET'."""
    return [f"0x{v:08x}/0x{m:08x}+{off}" for v, m, off in u32_keys(cidr, field)]


def cidr_from_keys(keys: list[tuple[int, int, int]], version: int, field: str) -> str | None:
    """The CIDR that u32 keys (value, mask, offset) match on `field`, or None if they are not such a match."""
    size = 4 if version == 4 else 16
    base = _OFFSET[(version, field)]
    value, mask = bytearray(size), bytearray(size)
    for v, m, off in keys:
        i = off - base
        if i < 0 or i + 4 > size or i % 4:
            return None
        value[i : i + 4] = struct.pack("!I", v & m)
        mask[i : i + 4] = struct.pack("!I", m)
    bits = int.from_bytes(mask, "big")
    prefix = bin(bits).count("1")
    if bits != ((1 << (size * 8)) - 1) ^ ((1 << (size * 8 - prefix)) - 1):
        return None  # not a contiguous prefix: not one of ours
    try:
        return str(ipaddress.ip_network((bytes(value), prefix)))
    except ValueError:
        return None


def decode_u32_sel(raw: bytes) -> list[tuple[int, int, int]]:
    """(value, mask, offset) keys of a raw `struct tc_u32_sel` (16-byte header, then 16-byte keys: be32 mask,
    be32 val, int off, int offmask). Decoded here because pyroute2 0.9's own decoding of it is misaligned."""
    if len(raw) < 16:
        return []
    nkeys = raw[2]
    keys = []
    for k in range(nkeys):
        at = 16 + 16 * k
        if at + 16 > len(raw):
            break
        mask, value = struct.unpack_from("!II", raw, at)
        (off,) = struct.unpack_from("=i", raw, at + 8)
        keys.append((value, mask, off))
    return keys


def version_of(cidr: str) -> int:
    return ipaddress.ip_network(cidr).version


def _match(cidr: str, field: str) -> str:
    net = ipaddress.ip_network(cidr)
    return f"match {'ip' if net.version == 4 else 'ip6'} {field} {cidr}"


def render_egress_filters(tc: str, ifname: str, parent: str, flowid: str, peers: Peers) -> list[str]:
    """`tc filter` lines that send traffic to the peers into the shaped class (what --dry-run prints)."""
    return [
        f"{tc} filter add dev {ifname} parent {parent} protocol {'ip' if version_of(c) == 4 else 'ipv6'} "
        f"prio {EGRESS_PRIO[version_of(c)]} u32 {_match(c, 'dst')} flowid {flowid}"
        for c in peers
    ]


def render_ingress_filters(tc: str, ifname: str, ifb: str, peers: Peers) -> list[str]:
    """`tc filter` lines that redirect what arrives from the peers (or, without peers, everything) to the ifb."""
    action = f"action mirred egress redirect dev {ifb}"
    if not peers:
        return [f"{tc} filter add dev {ifname} parent ffff: protocol all prio {INGRESS_PRIO[4]} u32 match u32 0 0 {action}"]
    return [
        f"{tc} filter add dev {ifname} parent ffff: protocol {'ip' if version_of(c) == 4 else 'ipv6'} "
        f"prio {INGRESS_PRIO[version_of(c)]} u32 {_match(c, 'src')} {action}"
        for c in peers
    ]
