"""What shaping one link means: the LinkShape a user asks for, and the qdisc plan derived from it.

The plan is pure data (no netlink): `tc.py` applies it through pyroute2 and `render_tc()` prints the equivalent
`tc` command lines for `--dry-run`, so the command-building logic is testable without root.
"""

from __future__ import annotations

import dataclasses
import math

from shaping import classify
from shaping.errors import InputError
from shaping.units import format_rate, format_size

# The testbed's qdiscs carry this major handle ("7e57" reads "test"): it marks them as ours.
OWNED_MAJOR = 0x7E57
ROOT_HANDLE = OWNED_MAJOR << 16  # 7e57:
CLASS_HANDLE = ROOT_HANDLE | 1  # 7e57:1, the shaped class (every packet, or with peers what goes to them)
UNSHAPED_HANDLE = ROOT_HANDLE | 2  # 7e57:2, with peers: the default class, everything not to a peer (unshaped)
NETEM_HANDLE = 0x7E58 << 16  # 7e58:, netem below the rate limiter (delay/loss)

QDISC_KINDS = ("htb", "tbf")
TBF_MAX_RATE_BPS = (2**32 - 1) * 8  # tbf packs the rate as 32-bit bytes/s: about 34.36 Gbit/s
MIN_BURST_FRAMES = 2  # the default bucket holds at least two full frames
BURST_TIME_S = 1e-3  # default bucket: about 1 ms of data at the rate
BURST_POLICY = "1ms-2frames"  # the default bucket's rule, part of a trial's id (was "at least 64 KB" before schema 6)
MAX_QUANTUM_BYTES = 200_000  # above this the kernel warns "quantum of class is big"
TBF_LATENCY_S = 0.05  # queue tbf may build before dropping (what the papers' tc line used)
BURST_TOLERANCE = 0.02  # the kernel stores a burst in ticks: read back, it is a few bytes off; within 2% it is equal
ETH_HEADER_BYTES = 14
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12


def default_burst_bytes(rate_bps: int, mtu: int = 1500) -> int:
    """About 1 ms of data at the rate, never below two full frames: 2 Mbit 3028 B, 100M 12.5 KB, 1G 125 KB,
    10G 1.25 MB, 100G 12.5 MB. Why not larger at low rates: a full bucket lets a flow run ahead of the rate by
    burst / rate, after every idle moment; the testbed's old 64 KB floor was a 262 ms head start at 2 Mbit/s and
    refilled while the ranks computed, so a compressed step's messages passed unshaped (docs/shaping.md, Burst). HTB
    and TBF still pass 64 KB GSO segments with a small bucket (HTB goes into debt; TBF segments them): 2 Mbit/s with
    a 2 KB bucket gave exactly the ideal goodput."""
    return max(MIN_BURST_FRAMES * (mtu + ETH_HEADER_BYTES), math.ceil(rate_bps / 8 * BURST_TIME_S))


def default_quantum_bytes(rate_bps: int, mtu: int = 1500) -> int:
    """HTB quantum: rate/1000 clamped to [one frame, 200 KB] so the kernel neither warns nor starves."""
    return int(min(MAX_QUANTUM_BYTES, max(mtu + ETH_HEADER_BYTES, rate_bps // 8 // 1000)))


def ideal_goodput_bps(rate_bps: float, mtu: int = 1500) -> float:
    """TCP payload rate on a link shaped at rate_bps (the shaper counts L2 bytes): 0.956 x rate at MTU 1500."""
    return rate_bps * (mtu - TCP_IP_HEADER_BYTES) / (mtu + ETH_HEADER_BYTES)


@dataclasses.dataclass(frozen=True)
class LinkShape:
    """How one direction of one link is shaped. Validated on construction."""

    rate_bps: int
    burst_bytes: int | None = None  # None: default_burst_bytes(rate_bps)
    qdisc: str = "htb"
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.qdisc not in QDISC_KINDS:
            raise InputError(f"--qdisc {self.qdisc!r}: unknown; accepted {', '.join(QDISC_KINDS)}")
        if self.qdisc == "tbf" and self.rate_bps > TBF_MAX_RATE_BPS:
            raise InputError(
                f"--bw {format_rate(self.rate_bps)} is above tbf's 32-bit limit of {format_rate(TBF_MAX_RATE_BPS)} "
                "(rate is packed as bytes/s in 32 bits); use --qdisc htb, which takes 64-bit rates"
            )
        if self.burst_bytes is not None and self.burst_bytes < 1600:
            raise InputError(f"--burst {self.burst_bytes}b is smaller than one frame; accepted at least 1600 bytes")
        if self.jitter_s and not self.delay_s:
            raise InputError("--jitter needs --delay: jitter is a variation around a delay")

    @property
    def effective_burst_bytes(self) -> int:
        return self.burst_bytes if self.burst_bytes is not None else default_burst_bytes(self.rate_bps)

    @property
    def quantum_bytes(self) -> int:
        return default_quantum_bytes(self.rate_bps)

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss_pct)

    def describe(self) -> str:
        text = f"{self.qdisc} {format_rate(self.rate_bps)} burst {format_size(self.effective_burst_bytes)}"
        if self.delay_s:
            text += f" delay {self.delay_s * 1e3:g}ms"
        if self.jitter_s:
            text += f"±{self.jitter_s * 1e3:g}ms"
        if self.loss_pct:
            text += f" loss {self.loss_pct:g}%"
        return text

    @classmethod
    def from_dict(cls, d: dict, *, read_back: bool = False) -> LinkShape:
        """The LinkShape of a `to_dict()` (a cluster record), or of a `tc.show()` read-back (netem nested under
        "netem") with `read_back=True`: then a burst within BURST_TOLERANCE of the default is the default."""
        netem = d.get("netem") or {}
        rate_bps = int(d["rate_bps"])
        burst = int(d["burst_bytes"]) if d.get("burst_bytes") else None
        tolerance = BURST_TOLERANCE if read_back else 0.0
        if burst is not None and abs(burst - default_burst_bytes(rate_bps)) <= tolerance * default_burst_bytes(
            rate_bps
        ):
            burst = None
        return cls(
            rate_bps=rate_bps,
            burst_bytes=burst,
            qdisc=d.get("qdisc") or "htb",
            delay_s=float(d.get("delay_s", netem.get("delay_s", 0.0)) or 0.0),
            jitter_s=float(d.get("jitter_s", netem.get("jitter_s", 0.0)) or 0.0),
            loss_pct=float(d.get("loss_pct", netem.get("loss_pct", 0.0)) or 0.0),
        )

    def matches(self, shown: dict | None) -> bool:
        """Whether a `tc.show()` read-back is this shape, owned by the testbed (burst within BURST_TOLERANCE: the
        kernel's ticks round it; delay/jitter to the microsecond, loss to 0.001%)."""
        if not shown or not shown.get("owned") or shown.get("qdisc") != self.qdisc:
            return False
        if shown.get("rate_bps") != self.rate_bps or not shown.get("burst_bytes"):
            return False
        if abs(shown["burst_bytes"] - self.effective_burst_bytes) > BURST_TOLERANCE * self.effective_burst_bytes:
            return False
        netem = shown.get("netem") or {}
        return (
            abs(netem.get("delay_s", 0.0) - self.delay_s) < 1e-6
            and abs(netem.get("jitter_s", 0.0) - self.jitter_s) < 1e-6
            and abs(netem.get("loss_pct", 0.0) - self.loss_pct) < 1e-3
        )

    def to_flags(self) -> list[str]:
        """The shaping flags that ask for exactly this shape (`shape_from_flags` and `python -m shaping apply` read
        them back to an equal LinkShape)."""
        flags = ["--bw", str(self.rate_bps), "--qdisc", self.qdisc]
        if self.burst_bytes is not None:
            flags += ["--burst", str(self.burst_bytes)]
        if self.delay_s:
            flags += ["--delay", f"{self.delay_s * 1e6:g}us"]
        if self.jitter_s:
            flags += ["--jitter", f"{self.jitter_s * 1e6:g}us"]
        if self.loss_pct:
            flags += ["--loss", f"{self.loss_pct:g}"]
        return flags

    def to_dict(self) -> dict:
        return {
            "qdisc": self.qdisc,
            "rate_bps": self.rate_bps,
            "burst_bytes": self.effective_burst_bytes,
            "quantum_bytes": self.quantum_bytes if self.qdisc == "htb" else None,
            "delay_s": self.delay_s,
            "jitter_s": self.jitter_s,
            "loss_pct": self.loss_pct,
        }


def shape_from_flags(
    bw: str,
    burst: str | None = None,
    qdisc: str = "htb",
    delay: str | None = None,
    jitter: str | None = None,
    loss: str | None = None,
) -> LinkShape:
    """The LinkShape that the shaping flags (`--bw --burst --qdisc --delay --jitter --loss`) ask for."""
    from shaping.units import parse_percent, parse_rate_bps, parse_size_bytes, parse_time_s

    return LinkShape(
        rate_bps=parse_rate_bps(bw, "--bw"),
        burst_bytes=parse_size_bytes(burst, "--burst") if burst else None,
        qdisc=qdisc,
        delay_s=parse_time_s(delay, "--delay") if delay else 0.0,
        jitter_s=parse_time_s(jitter, "--jitter") if jitter else 0.0,
        loss_pct=parse_percent(loss, "--loss") if loss else 0.0,
    )


def _handle(h: int) -> str:
    major, minor = h >> 16, h & 0xFFFF
    return f"{major:x}:" if minor == 0 else f"{major:x}:{minor:x}"


def unshaped_class_shape() -> LinkShape:
    """The default class of a classified root (peers given): what is not the cluster's traffic passes unshaped."""
    return LinkShape(rate_bps=classify.UNSHAPED_RATE_BPS)


def render_tc(
    ifname: str, shape: LinkShape, netns: str | None = None, peers: classify.Peers = ()
) -> list[str]:
    """The `tc` command lines equivalent to applying `shape` on `ifname` (what --dry-run prints); with `peers`,
    only traffic to them is shaped (classifier filters) and the rest goes to the unshaped default class."""
    classify.check(shape.qdisc, peers)
    tc = f"tc -n {netns}" if netns else "tc"
    rate = f"{shape.rate_bps}bit"
    burst = f"{shape.effective_burst_bytes}b"
    lines: list[str] = []
    if shape.qdisc == "htb":
        default = UNSHAPED_HANDLE if peers else CLASS_HANDLE
        lines.append(
            f"{tc} qdisc replace dev {ifname} root handle {_handle(ROOT_HANDLE)} htb default {default & 0xFFFF:x}"
        )
        lines.append(
            f"{tc} class replace dev {ifname} parent {_handle(ROOT_HANDLE)} classid {_handle(CLASS_HANDLE)} htb "
            f"rate {rate} ceil {rate} burst {burst} cburst {burst} quantum {shape.quantum_bytes}"
        )
        if peers:
            free = unshaped_class_shape()
            lines.append(
                f"{tc} class replace dev {ifname} parent {_handle(ROOT_HANDLE)} classid {_handle(UNSHAPED_HANDLE)} "
                f"htb rate {free.rate_bps}bit ceil {free.rate_bps}bit burst {free.effective_burst_bytes}b "
                f"cburst {free.effective_burst_bytes}b quantum {free.quantum_bytes}"
            )
            lines += classify.render_egress_filters(
                tc, ifname, _handle(ROOT_HANDLE), _handle(CLASS_HANDLE), peers
            )
    else:
        lines.append(
            f"{tc} qdisc replace dev {ifname} root handle {_handle(ROOT_HANDLE)} tbf rate {rate} burst {burst} "
            f"latency {TBF_LATENCY_S * 1e3:g}ms"
        )
    if shape.needs_netem:
        netem = f"{tc} qdisc replace dev {ifname} parent {_handle(CLASS_HANDLE)} handle {_handle(NETEM_HANDLE)} netem"
        if shape.delay_s:
            netem += f" delay {shape.delay_s * 1e6:g}us"
            if shape.jitter_s:
                netem += f" {shape.jitter_s * 1e6:g}us"
        if shape.loss_pct:
            netem += f" loss {shape.loss_pct:g}%"
        lines.append(netem)
    return lines


def render_clear(ifname: str, netns: str | None = None) -> list[str]:
    tc = f"tc -n {netns}" if netns else "tc"
    return [f"{tc} qdisc del dev {ifname} root handle {_handle(ROOT_HANDLE)}"]
