"""Collective costs (alpha-beta, ring algorithms), with `B_eff = efficiency * B`:

   all-reduce of n bytes on p workers   2(p-1) alpha + 2(p-1)/p * 8n / B_eff
   all-gather of n_c bytes per worker    (p-1) alpha +  (p-1)   * 8n_c / B_eff

A compressor with r dependent rounds pays the latency term r times; its `payload_bytes` is the total of all rounds.
The calibrated host cost (k per wire byte, gamma per reduced byte) bounds a collective from below, and the
contention terms add what compute running beside it costs (perfmodel/fit.py fits them). `Network` holds the terms.
Bandwidths are in **bits** per second (as tc and the results store write them); payloads in bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.errors import InputError

COLLECTIVES = ("allreduce", "allgather")


@dataclass(frozen=True)
class Network:
    """The link every worker sees. `efficiency` is the fraction of `bandwidth_bps` a collective achieves."""

    world_size: int
    bandwidth_bps: float
    latency_s: float = 0.0
    efficiency: float = 1.0
    host_s_per_wire_byte: float = 0.0  # k: host time per byte a rank sends (copies, socket stack); calibrated
    reduce_s_per_byte: float = 0.0  # gamma: host time per byte a rank reduces; calibrated
    allgather_efficiency: float | None = None  # all-gather's fraction of the link when it differs (None: efficiency)
    # what running beside the ranks' compute adds to a collective (calibrated by the contention probe): per latency
    # step, and per byte a rank sends
    contention_latency_s: float = 0.0
    contention_s_per_wire_byte: float = 0.0
    # how much later than the typical rank the slowest one finishes a step the ranks start together (calibrated by
    # the lockstep probe; ranks time-sharing cores): a floor under the straggler term of the profile's spread
    skew_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("host_s_per_wire_byte", "reduce_s_per_byte", "contention_latency_s", "contention_s_per_wire_byte",
                     "skew_s"):  # fmt: skip
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise InputError(f"{name} {v!r}: expected a finite number >= 0 (seconds)")
        if int(self.world_size) != self.world_size or self.world_size < 1:
            raise InputError(f"world size {self.world_size!r}: expected an integer >= 1")
        if not (self.bandwidth_bps > 0 and math.isfinite(self.bandwidth_bps)):
            raise InputError(f"bandwidth {self.bandwidth_bps!r} bit/s: expected a positive finite rate")
        if self.latency_s < 0 or not math.isfinite(self.latency_s):
            raise InputError(f"latency {self.latency_s!r} s: expected >= 0")
        for name in ("efficiency", "allgather_efficiency"):
            v = getattr(self, name)
            if v is not None and not (0 < v <= 1):
                raise InputError(f"{name.replace('_', ' ')} {v!r}: expected a fraction in (0, 1]")



# --------------------------------------------------------------------------------------------- cost formulas
def allreduce_time_s(
    n_bytes: float,
    world_size: int,
    bandwidth_bps: float,
    latency_s: float = 0.0,
    efficiency: float = 1.0,
    rounds: int = 1,
) -> float:
    """Ring all-reduce of `n_bytes` in total over `rounds` dependent rounds: 2(p-1)a*r + 2(p-1)/p * 8n/B_eff."""
    p = world_size
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * latency_s * rounds + 2 * (p - 1) / p * 8.0 * n_bytes / (bandwidth_bps * efficiency)


def allgather_time_s(
    n_bytes_per_worker: float,
    world_size: int,
    bandwidth_bps: float,
    latency_s: float = 0.0,
    efficiency: float = 1.0,
    rounds: int = 1,
) -> float:
    """Ring all-gather of `n_bytes_per_worker` from each worker: (p-1)a*r + (p-1) * 8n_c/B_eff."""
    p = world_size
    if p <= 1:
        return 0.0
    return (p - 1) * latency_s * rounds + (p - 1) * 8.0 * n_bytes_per_worker / (bandwidth_bps * efficiency)


def collective_host_s(collective: str, n_bytes: float, net: Network) -> float:
    """Host time one rank spends on a collective (calibrated k and gamma; 0 without a calibration):
    all-reduce of n bytes          (p-1)/p * n * (2k + gamma)   (sends 2(p-1)/p n, reduces (p-1)/p n)
    all-gather of n_c per worker   (p-1) * n_c * k              (sends (p-1) n_c, reduces nothing)"""
    p = net.world_size
    if p <= 1:
        return 0.0
    if collective == "allreduce":
        return (p - 1) / p * n_bytes * (2 * net.host_s_per_wire_byte + net.reduce_s_per_byte)
    if collective == "allgather":
        return (p - 1) * n_bytes * net.host_s_per_wire_byte
    raise InputError(f"collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


def collective_time_s(
    collective: str, n_bytes: float, rounds: int, net: Network, *, beside_compute_s: float = math.inf
) -> float:
    """Latency term + max(bandwidth term, host time) + contention: a collective never runs faster than its host can
    copy and reduce (gloo on CPU at high rates); with no calibrated host cost this is the plain alpha-beta time.
    The contention (`collective_contention_s`) is what compute running beside the collective adds; with compute only
    for the collective's first `beside_compute_s` seconds, only the part of the collective that overlaps it pays."""
    if collective == "allreduce":
        fn = allreduce_time_s
    elif collective == "allgather":
        fn = allgather_time_s
    else:
        raise InputError(f"collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    p, b, eff = net.world_size, net.bandwidth_bps, net.efficiency
    if collective == "allgather" and net.allgather_efficiency is not None:
        eff = net.allgather_efficiency
    latency = fn(0.0, p, b, net.latency_s, eff, rounds)
    body = max(fn(n_bytes, p, b, 0.0, eff, rounds), collective_host_s(collective, n_bytes, net))
    free = latency + body
    extra = collective_contention_s(collective, n_bytes, rounds, net)
    if extra <= 0 or beside_compute_s >= free + extra:
        return free + extra
    # slowed while compute runs beside it (progress at free / (free + extra) of its rate), then at full speed
    return free + max(0.0, beside_compute_s) * extra / (free + extra)


def collective_contention_s(collective: str, n_bytes: float, rounds: int, net: Network) -> float:
    """What a collective loses to the compute running beside it (calibrated; 0 without a calibration): every latency
    step pays `contention_latency_s` (a peer's thread waits for a core) and every byte a rank sends
    `contention_s_per_wire_byte` (the pipe idles while its sender is descheduled):
        all-reduce  2(p-1) r * c_lat + 2(p-1)/p * n * c_byte      all-gather  (p-1) r * c_lat + (p-1) * n_c * c_byte"""
    p = net.world_size
    if p <= 1 or not (net.contention_latency_s or net.contention_s_per_wire_byte):
        return 0.0
    if collective == "allreduce":
        steps, wire = 2 * (p - 1) * rounds, 2 * (p - 1) / p * n_bytes
    else:
        steps, wire = (p - 1) * rounds, (p - 1) * n_bytes
    return steps * net.contention_latency_s + wire * net.contention_s_per_wire_byte


# --------------------------------------------------------------------------------------------- the cluster's shape
@dataclass(frozen=True)
class Layout:
    """The links a ring crosses, host by host in ring order (rank order follows host order):

    - `host_rates_bps[i]`: host i's link rate, the same in both directions (None: unshaped);
    - `rack_of[i]`: host i's rack (empty: one switch); `uplink_bps`: each rack's spine link, each direction
      (None: unshaped);
    - `cross_flows[i]`: bulk TCP flows of cross traffic on host i's link, each direction (iperf3 --bidir);
      `spine_cross_flows[r]`: those that also cross rack r's uplink, each direction.

    A link shared by k other TCP flows leaves the ring's one flow 1/(k+1) of it (TCP's fair share): that names the
    link that bounds the ring. What the flows leave a collective is measured, not derived from the share
    (`testbed calibrate --cross-traffic N`; docs/topologies.md)."""

    host_rates_bps: tuple[float | None, ...]
    rack_of: tuple[int, ...] = ()
    uplink_bps: float | None = None
    cross_flows: tuple[int, ...] = ()
    spine_cross_flows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.host_rates_bps)
        if n < 1:
            raise InputError("a layout needs at least one host")
        for r in (*self.host_rates_bps, self.uplink_bps):
            if r is not None and not (r > 0 and math.isfinite(r)):
                raise InputError(f"link rate {r!r} bit/s: expected a positive finite rate (None: unshaped)")
        for name, seq in (("rack_of", self.rack_of), ("cross_flows", self.cross_flows)):
            if seq and len(seq) != n:
                raise InputError(f"{name}: {len(seq)} entries for {n} hosts")
        if any(k < 0 for k in (*self.cross_flows, *self.spine_cross_flows)):
            raise InputError("cross-traffic flows: expected counts >= 0")


@dataclass(frozen=True)
class Bottleneck:
    """The link that bounds a ring's step: its rate left for the ring (bit/s; inf: nothing shaped) and its name."""

    rate_bps: float
    link: str

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.rate_bps)


def _fmt_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def ring_bottleneck(layout: Layout) -> Bottleneck:
    """The slowest edge of the ring h0 -> h1 -> ... -> h(n-1) -> h0. Every ring step sends one chunk on every edge at
    once, so each step (all-reduce and all-gather alike) lasts as long as its slowest edge:

        edge i -> j   min( B_i / (1 + x_i),  B_j / (1 + x_j),  [racks differ]  U / (e_out(a) + y_a),  U / (e_in(b) + y_b) )

    B_i host i's rate, x_i cross flows on its link, U the uplink rate, e_out(a) / e_in(b) the ring edges leaving rack a
    / entering rack b in the same step (they share the spine), y_r cross flows over rack r's uplink. Ties name the
    host link (the spine is named only when it is strictly slower)."""
    rates = layout.host_rates_bps
    n = len(rates)
    if n <= 1:
        return Bottleneck(math.inf, "none (one host)")
    flows = layout.cross_flows or (0,) * n
    racks = layout.rack_of or (0,) * n
    spine_flows = layout.spine_cross_flows
    edges = [(i, (i + 1) % n) for i in range(n)]
    out_of: dict[int, int] = {}
    into: dict[int, int] = {}
    for i, j in edges:
        if racks[i] != racks[j]:
            out_of[racks[i]] = out_of.get(racks[i], 0) + 1
            into[racks[j]] = into.get(racks[j], 0) + 1
    best = Bottleneck(math.inf, "unshaped")
    for i, j in edges:
        for h in (i, j):
            if rates[h] is not None:
                share = rates[h] / (1 + flows[h])
                if share < best.rate_bps:
                    shared = f", shared with {flows[h]} cross-traffic flow{'s' * (flows[h] != 1)}" if flows[h] else ""
                    best = Bottleneck(share, f"h{h} link ({_fmt_rate(rates[h])}{shared})")
        if racks[i] != racks[j] and layout.uplink_bps is not None:
            for rack, steps in ((racks[i], out_of[racks[i]]), (racks[j], into[racks[j]])):
                y = spine_flows[rack] if rack < len(spine_flows) else 0
                share = layout.uplink_bps / (steps + y)
                if share < best.rate_bps:
                    extra = f" and {y} cross-traffic flow{'s' * (y != 1)}" if y else ""
                    best = Bottleneck(
                        share,
                        f"spine uplink of rack {rack} ({_fmt_rate(layout.uplink_bps)} shared by {steps} ring "
                        f"step{'s' * (steps != 1)}{extra})",
                    )
    return best


def from_flat_trials_s(flat_iter_s: float, flat_wire_s: float | None, coll_bottleneck_s: float,
                       coll_flat_s: float) -> float:  # fmt: skip
    """A shaped trial's iteration time (a straggler link, racks, cross traffic) predicted from the flat trials measured
    at the same rate (issue 36): their median iteration time plus what the collective at the ring's bottleneck
    (`ring_bottleneck`, with the terms calibrated at that rate, or beside as many cross-traffic flows) takes beyond
    their measured time on the wire,

        t = t_flat + max(0, T_coll(bottleneck) - wire_flat)

    A flat trial's wire time (the row's comm_wire_s) holds the wait for cores the other ranks compute on when ranks
    share cores; that wait hides under a slower link's transfer instead of adding to it. Where the flat rows carry no
    wire time (sync SGD's built-in all-reduce has no hook marks), the change of the calibrated collective:
    t = t_flat + T_coll(bottleneck) - T_coll(flat). Measured (bench/topologies.py, docs/benchmarks.md): the change
    alone over-predicted the small-message compressors' straggler trials by 18-28 % on 4 ranks sharing 2 cores."""
    if flat_wire_s is None or not math.isfinite(flat_wire_s):
        return flat_iter_s + coll_bottleneck_s - coll_flat_s
    return flat_iter_s + max(0.0, coll_bottleneck_s - flat_wire_s)
