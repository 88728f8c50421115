"""Shaping at high rates (25-400 Gbit/s NICs): HTB hardware offload, the ceilings of each method, the ifb's queues
and leaf. Pure functions plus two small probes of the NIC (ethtool -k, the link's queue count).

Methods and the rates they have been shown to hold (sources in docs/lab-guide.md, "High rates"):
- software HTB at the root (the default): every TX queue of the NIC serialises on the qdisc's one lock. Published:
  6.7 Gbit/s with 500 UDP flows and 48 classes on a 100G ConnectX-6 Dx (Linux commit 214baf22870c, "net/mlx5e:
  Support HTB offload", baseline without shaping 98.7 Gbit/s). Few TCP flows do better, many flows worse: above
  SOFTWARE_HTB_CEILING_BPS the request gets a warning and only the probe can say whether the rate held.
- HTB offload (`tc qdisc replace dev X root handle 7e57: htb offload`, Linux >= 5.13, mlx5 ConnectX-6 Dx and newer
  with `ethtool -K X hw-tc-offload on`): the HTB algorithm runs in the NIC; same source: 95.6 Gbit/s at 100G line
  rate. Classification must then be done in clsact (filters on the htb itself are not supported), with
  `action skbedit priority 7e57:1`. Ceiling: the NIC's line rate. Rate granularity 1 Mbit/s, burst ignored.
- ingress via ifb: always software (an ifb cannot offload), so the same software ceiling applies to downloads. On a
  lab cluster whose every host is shaped, egress shaping alone limits every peer flow (each flow leaves a shaped NIC).
- tbf: rate packed in 32 bits, at most TBF_MAX_RATE_BPS (about 34.36 Gbit/s): refused above (plan.py).
"""

from __future__ import annotations

import math
import subprocess

from shaping import classify
from shaping.errors import InputError
from shaping.plan import CLASS_HANDLE, ROOT_HANDLE, LinkShape, _handle
from shaping.units import format_rate, format_size

OFFLOAD_MODES = ("auto", "on", "off")
SOFTWARE_HTB_CEILING_BPS = 6_700_000_000  # published software HTB figure under many flows (see module docstring)
SOFTWARE_HTB_SOURCE = "software HTB measured 6.7 Gbit/s under 500 flows on a 100G ConnectX-6 Dx (Linux 214baf22870c)"
OFFLOAD_SOURCE = "HTB offload measured 95.6 Gbit/s of 100G line rate on ConnectX-6 Dx (Linux 214baf22870c)"
LEAF_RTT_S = 0.005  # the ifb leaf holds this much time of data at the rate (a bandwidth-delay product)
GRO_MAX_BYTES = 64 * 1024  # what arrives at ingress is GRO-merged: one packet can be this large
SKBEDIT_PRIO = 0x7E57  # clsact egress filter priority of the offload classifier (ours)


def leaf_limit_bytes(rate_bps: int, burst_bytes: int) -> int:
    """bfifo limit for a shaped class's leaf: the bandwidth-delay product at LEAF_RTT_S, never below two buckets nor
    two GRO-merged packets of 64 KB (the ifb sees what GRO made of the arriving frames: a leaf smaller than that drops
    whole 64 KB packets, and a lab link shaped at 50 Mbit/s with a 6.25 KB bucket carried 17.5 and 25.3 Mbit/s). The kernel on
    this machine has no fq_codel (checked with `python -m shaping kernel-check`)."""
    return int(max(2 * burst_bytes, 2 * GRO_MAX_BYTES, math.ceil(rate_bps / 8 * LEAF_RTT_S)))


def check_mode(mode: str) -> str:
    if mode not in OFFLOAD_MODES:
        raise InputError(f"--offload {mode!r}: expected one of {', '.join(OFFLOAD_MODES)}")
    return mode


def nic_offload_state(ifname: str, netns: str | None = None) -> str | None:
    """`on`, `off`, `off [fixed]` (the driver cannot offload) for hw-tc-offload, or None when ethtool cannot say."""
    argv = ["ethtool", "-k", ifname]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if line.strip().startswith("hw-tc-offload:"):
            return line.split(":", 1)[1].strip()
    return None


def resolve_offload(mode: str, state: str | None, ifname: str) -> bool:
    """Whether to use HTB offload: `off` never; `on` only where the NIC advertises hw-tc-offload (else one-line
    InputError); `auto` where it does."""
    check_mode(mode)
    capable = state is not None and "fixed" not in state
    if mode == "on" and not capable:
        why = "ethtool cannot read its features" if state is None else f"hw-tc-offload is {state}"
        raise InputError(f"--offload on: {ifname} cannot offload HTB ({why}); use --offload off or auto")
    return mode != "off" and capable


def ceiling(offload: bool, ingress: bool = False) -> tuple[int | None, str]:
    """(rate a method has been shown to hold, its source) for warnings; None: the NIC's line rate is the limit."""
    if offload and not ingress:
        return None, OFFLOAD_SOURCE
    return SOFTWARE_HTB_CEILING_BPS, SOFTWARE_HTB_SOURCE


def warnings_for(shape: LinkShape, *, offload: bool, ingress: bool) -> list[str]:
    """One line per direction whose method has not been shown to hold the requested rate."""
    out = []
    for direction, on_ifb in (("egress", False), ("ingress (ifb, software)", True)):
        if on_ifb and not ingress:
            continue
        limit, source = ceiling(offload, ingress=on_ifb)
        if limit is not None and shape.rate_bps > limit:
            hint = "; --offload on where the NIC has hw-tc-offload" if not on_ifb else "; shape egress on every host"
            out.append(
                f"warning: {direction} at {format_rate(shape.rate_bps)} is above {format_rate(limit)} "
                f"({source}); check the rate held with `testbed probe --all-pairs`{hint}"
            )
    return out


def render_offload(ifname: str, shape: LinkShape, peers: classify.Peers = (), netns: str | None = None) -> list[str]:
    """The commands of HTB offload on `ifname`: enable hw-tc-offload, an offloaded htb root, the shaped class, and
    a clsact egress classifier that marks the cluster's traffic (or every packet) with the class's priority."""
    if shape.qdisc != "htb":
        raise InputError(f"--offload with --qdisc {shape.qdisc}: only htb can be offloaded")
    if shape.needs_netem:
        raise InputError("--offload with --delay/--jitter/--loss: netem cannot run under an offloaded htb")
    tc = f"tc -n {netns}" if netns else "tc"
    ethtool = f"ip netns exec {netns} ethtool" if netns else "ethtool"
    rate = f"{shape.rate_bps}bit"
    lines = [
        f"{ethtool} -K {ifname} hw-tc-offload on",
        f"{tc} qdisc replace dev {ifname} root handle {_handle(ROOT_HANDLE)} htb offload",
        f"{tc} class replace dev {ifname} parent {_handle(ROOT_HANDLE)} classid {_handle(CLASS_HANDLE)} htb "
        f"rate {rate} ceil {rate}",
        f"{tc} qdisc replace dev {ifname} clsact",
    ]
    mark = f"action skbedit priority {_handle(CLASS_HANDLE)}"
    if not peers:
        lines.append(f"{tc} filter add dev {ifname} egress protocol all prio {SKBEDIT_PRIO} u32 match u32 0 0 {mark}")
    for cidr in peers:
        version = classify.version_of(cidr)
        lines.append(
            f"{tc} filter add dev {ifname} egress protocol {'ip' if version == 4 else 'ipv6'} "
            f"prio {SKBEDIT_PRIO + version} u32 match {'ip' if version == 4 else 'ip6'} dst {cidr} {mark}"
        )
    return lines


def render_clear_offload(ifname: str, netns: str | None = None) -> list[str]:
    tc = f"tc -n {netns}" if netns else "tc"
    return [f"{tc} qdisc del dev {ifname} root handle {_handle(ROOT_HANDLE)}", f"{tc} qdisc del dev {ifname} clsact"]


def describe_leaf(rate_bps: int, burst_bytes: int) -> str:
    return f"bfifo limit {format_size(leaf_limit_bytes(rate_bps, burst_bytes))} ({LEAF_RTT_S * 1e3:g} ms at the rate)"
