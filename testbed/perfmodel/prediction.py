"""Analytical performance model: predicted iteration time per compressor, crossover bandwidth, what-if knobs.

Pure functions over frozen dataclasses; SI units with the unit in the name (`_s`, `_bytes`, `_bps`).
Bandwidths are in **bits** per second (as tc and the results store write them); payloads in bytes.

The model (docs/performance-model.md has the derivation and where it breaks):

1. Collective costs (alpha-beta, ring algorithms), with `B_eff = efficiency * B`:
   all-reduce of n bytes on p workers   2(p-1) alpha + 2(p-1)/p * 8n / B_eff
   all-gather of n_c bytes per worker    (p-1) alpha +  (p-1)   * 8n_c / B_eff
   A compressor with r dependent rounds pays the latency term r times; its `payload_bytes` is the total of all rounds.
2. One iteration = forward + backward-with-communication + optimizer.  Buckets become ready during the backward
   pass at `ready_at_s` (measured without communication), in DDP reduction order.
   - Overlapped (the runner's default `--overlap on`: DDP's own all-reduce, the single-collective hooks that return
     their collective's future with decode chained, and powersgd's ordered communication worker): communication
     hides behind the remaining backward like syncsgd's, while encode and decode stay on the compute path.
     One compute resource runs, in this order: backward compute up to bucket i's `ready_at_s`, bucket i's encode
     (the hook), and any decode whose data has arrived (a callback interrupts backward when its data lands):
         hook_i  = (compute cursor after backward up to ready_i and the decodes that landed before) ; enc_i after it
         comm_start_i = max(hook_i + enc_i, link_free) ;  link_free = comm_end_i = comm_start_i + T_comm(i)
         dec_i runs at max(comm_end_i, compute cursor) for decode_s_i and pushes the rest of backward back by it.
     The backward phase ends when the backward compute and the last decode are done. A multi-round compressor's
     work between its rounds (powersgd: orthogonalise, Q = M^T P) is part of its profiled encode, charged to the
     hook: an upper bound on the compute-path cost.
   - Blocking (`hook_blocks_backward=True`, the runner's `--overlap off`: every collective is waited inside the
     hook): the backward stream stalls for encode + communication + decode of each bucket, so those add up in
     series with backward compute:  end_i = max(ready_i + stall, end_{i-1}) + enc_i + T_comm(i) + dec_i.
   `syncsgd` (DDP's built-in all-reduce, no hook) is always overlapped.
3. World size 1: no gradient exchange, so no communication and no encode/decode.
4. Stragglers: every iteration ends at a synchronisation, so it waits for the slowest rank's compute. With the
   profile's iteration-to-iteration spread sigma (`compute_jitter_s`), the median iteration is longer by
   sigma * z_p, z_p = Phi^-1((1/2)^(1/p)) (`straggler_s`), at least by the calibration's lockstep skew
   (`Network.skew_s`, the probe's small CNN: ranks that time-share cores finish a step apart by about a time
   slice). A co-located profile whose ranks are the world size measured the term itself (`Profile.lockstep_skew_s`:
   per step started together, the slowest rank minus the median one, with the model): it is used as is
   (`slowest_rank_s`).
5. Contention (calibrated; `collective_contention_s`): a collective running beside compute is slower by c_lat per
   latency step and c_byte per wire byte, for the part of it that overlaps the backward compute still to run (none
   after backward's end, none inside a hook that holds backward).
6. Floor (co-located profiles, when their co-located ranks are the world size): a step exposes at least the
   communication it exposed when the ranks trained with the compressor in lockstep on loopback
   (`CompressorProfile.lockstep_comm_s`), since a slower link only adds to it: ranks time-sharing cores wait at every
   collective for the ones still computing, more than the skew of their compute alone (4 ranks on 2 cores, cnn:
   20-26 ms exposed in place against 4 ms for the same collectives idle and 7-9 ms compute skew); and a step takes
   at least the whole step it took there (`CompressorProfile.lockstep_step_s`, the slowest rank's, median over
   steps): what the composition of medians leaves out there (a peer's decode or encode landing in this rank's
   forward, the phases' correlation) stays in (4 ranks on 2 cores, resnet18, Sign-SGD: trial 1.67 s, in place
   1.63 s, the composition of the profile's medians 1.58 s). The floors were measured on loopback or on the
   cluster's unshaped links (`testbed profile --on`), where the link costs next to nothing: at a shaped rate the
   link's own addition (the composition at that rate minus the composition on a free link: an all-gather left
   exposed at a low rate) is added to them, so a floor never flattens a curve. (The composition at an unshaped
   cluster's rate, 6 Gbit/s for 3 resnet18 bs16 ranks, is within 0.2 ms of a free link's: the free link stays the
   reference for both.) Where the link adds nothing to the composition (less than `FREE_LINK_SHARE` of it: an
   unshaped link, or host-bound collectives at a rate their host cost outlasts the wire) the floors' rate is this
   rate, and the step measured whole in place on the same links is a measurement of this very step: the floor
   decides below the composition too (seeds 7-8 of issue 32, re-scored: unshaped sync SGD composed 6.8-26.5 % above
   its trials, from the collectives' host work the composition charges to backward: its backward 7-38 % longer than
   the trials' in 13 of 15 configurations, `bench/rescore_seed.py --split`; its in-place step lay within 1.7-6.6 %
   of the trials but where the profile ran slow, seed 7's resnet50 at +21 %; judged from seed 9 on).
7. What bound it (issue 32): the prediction names the term that decided it (`Prediction.bound_by`, the largest of
   `Prediction.breakdown`: compute, co-location, codec, exposed communication, host cost, skew; "floor" whenever a
   floor decides), and carries an
   interval [low_s, high_s] from the profile's spread (`Profile.relative_spread`) and the calibration's
   (`comm_rel_spread`, the collectives' fit residual): half-width sqrt((r_p (compute + codec))^2 + (r_c exposed)^2).
   A measured floor is shown beside the composition (`floor_s`) and decides whenever it lies above the composition
   (then `bound_by` is "floor" and `floor_note` says by how much the composition fell short, and whether within the
   two's spreads); the interval reaches down to the composition's. At a free link it decides below the composition
   too (point 6): then its breakdown term is negative (what the measurement takes off the composition), the note
   says so, and the interval reaches up to the composition's. The floor has an interval of its own, from its
   spread (`CompressorProfile.floor_spread_s`, half its range over the launches pooled into the profile: one launch's
   floor moved 66-81 ms on a fast co-located configuration, see docs/performance-model.md), and the prediction's
   interval reaches its top. (From 00b75fe to seed 3 a floor decided only above the composition's interval; rescored
   on seeds 2 and 3 that rule scored worse: docs/benchmarks.md, "Held-out validation, seed 3".)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

from testbed.perfmodel.collectives import Network, collective_host_s, collective_time_s
from testbed.perfmodel.profiles import Profile

# Compressors that overlap whatever the runner's --overlap says: syncsgd is DDP's built-in all-reduce (no hook).
# With --overlap off every hook (fp16 and bf16 too) waits inside the hook.
ASYNC_COMPRESSORS = frozenset({"syncsgd"})
# the terms a prediction's time is made of, in `Prediction.breakdown` (its largest is `bound_by`)
BOUND_TERMS = ("compute", "co-location", "codec", "exposed communication", "host cost", "skew", "floor")
FREE_LINK_BPS = 1e15  # the rate the in-place floors were measured at, as far as the composition can tell
# where the link adds less than this share to the composition, the rate is the floors' own (a free link): the
# composition at an unshaped cluster's rate, 6 Gbit/s for 3 resnet18 bs16 ranks, lies 0.2 ms (0.04 %) above a free
# link's, and host-bound collectives add nothing at any rate their host cost outlasts the wire
FREE_LINK_SHARE = 1e-3


@dataclass(frozen=True)
class BucketTimeline:
    index: int
    ready_s: float  # wall time (from backward start) when the bucket was handed to the hook
    comm_start_s: float
    comm_end_s: float
    done_s: float  # decoded


@dataclass(frozen=True)
class Prediction:
    """Predicted iteration of one compressor on one network. Phase sums are totals, not just the exposed part."""

    compressor: str
    world_size: int
    bandwidth_bps: float
    iter_time_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    encode_s: float
    comm_s: float
    decode_s: float
    samples_per_s: float  # global: world_size * batch_size / iter_time_s
    hook_blocks_backward: bool
    timeline: tuple[BucketTimeline, ...] = ()
    straggler_s: float = 0.0  # the slowest of world_size ranks beyond the typical one (included in iter_time_s)
    # the composition of the profile's phases (with straggler_s) before the in-place floors; iter_time_s is the larger
    # of it and the floors (`CompressorProfile.lockstep_comm_s`, `lockstep_step_s`). None: built without one.
    composed_s: float | None = None
    # what decided iter_time_s (the largest of `breakdown`: BOUND_TERMS) and the terms that add up to it
    bound_by: str = "compute"
    breakdown: tuple[tuple[str, float], ...] = ()
    floor_s: float | None = None  # the in-place floor at this rate (None: none measured for this world size)
    floor_note: str = ""  # where a floor decides: why the composition fell short of it
    low_s: float | None = None  # the interval from the profile's and the calibration's spread
    high_s: float | None = None
    # the composition's backward phase split at the end of its compute (from backward's start; the encodes and the
    # decodes that landed before are in it); what follows it is `after_backward_s`. What a trial's backward_s +
    # encode_s measure
    backward_compute_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def after_backward_s(self) -> float:
        """The composition's time after its backward compute (the wait for the last collectives and decodes) and the
        slowest rank's lateness: what a trial's comm_s + decode_s measure."""
        composed = self.iter_time_s if self.composed_s is None else self.composed_s
        return max(0.0, composed - self.forward_s - self.optimizer_s - self.backward_compute_s)

    @property
    def exposed_s(self) -> float:
        """Time the iteration spends beyond pure compute (communication and codec work that was not hidden)."""
        return self.iter_time_s - self.compute_s



def compute_finish_s(now: float, work_s: float, busy: Sequence[tuple[float, float, float]]) -> float:
    """When `work_s` of compute started at `now` is done, while collectives take host time beside it.

    `busy` are the link intervals (start, end, f) in time order, f = host time / duration of that collective (capped
    at 1): during an interval compute advances at rate 1 - f (one compute resource shared with the collective's
    copies and reductions; host-bound, f = 1, stalls it), elsewhere at rate 1."""
    for start, end, f in busy:
        if end <= now or f <= 0:
            continue
        if start > now:
            if work_s <= start - now:
                return now + work_s
            work_s -= start - now
            now = start
        rate = 1.0 - min(1.0, f)
        if rate > 0 and rate * (end - now) >= work_s:
            return now + work_s / rate
        work_s -= rate * (end - now)
        now = end
    return now + work_s


def compute_done_between(t0: float, t1: float, busy: Sequence[tuple[float, float, float]]) -> float:
    """Compute progress (seconds of work) between t0 and t1 under the same sharing as `compute_finish_s`."""
    done = max(0.0, t1 - t0)
    for start, end, f in busy:
        lo, hi = max(start, t0), min(end, t1)
        if hi > lo and f > 0:
            done -= min(1.0, f) * (hi - lo)
    return max(0.0, done)


# --------------------------------------------------------------------------------------------- iteration model
def straggler_s(jitter_s: float, world_size: int) -> float:
    """How much later than the typical rank the slowest of `world_size` synchronised ranks finishes its compute, in
    the median iteration: the ranks' compute times are independent draws with spread `jitter_s` (a normal
    approximation), and the iteration waits for their maximum, whose median is at the (1/2)^(1/p) quantile:
    0.545 sigma for p = 2, 0.998 sigma for 4, 1.40 sigma for 8, 2.1 sigma for 64."""
    if world_size <= 1 or jitter_s <= 0:
        return 0.0
    return jitter_s * NormalDist().inv_cdf(0.5 ** (1.0 / world_size))


def slowest_rank_s(profile: Profile, net: Network) -> float:
    """How much later than the typical rank the slowest one finishes its compute, in the median iteration. Measured
    directly when the profile's co-located ranks are the world size (its lockstep skew: per step started together,
    slowest minus median rank); else estimated from the profile's spread (`straggler_s`), at least the
    calibration's lockstep skew (the probe's small CNN). 0 for one rank."""
    p = net.world_size
    if p <= 1:
        return 0.0
    if profile.lockstep_skew_s is not None and profile.colocated_ranks == p:
        return profile.lockstep_skew_s
    return max(straggler_s(profile.compute_jitter_s, p), net.skew_s)


def predict_iteration(
    profile: Profile,
    compressor: str,
    net: Network,
    *,
    hook_blocks_backward: bool = False,
    comm_rel_spread: float = 0.0,
) -> Prediction:
    """Predicted time of one training iteration with `compressor` on `net` (see the module docstring).
    `hook_blocks_backward` True models the runner's `--overlap off`; False (default) its `--overlap on`.
    `comm_rel_spread`: the relative uncertainty of the collective terms (the calibration's fit residual), for the
    interval."""
    comp = profile.compressor(compressor)
    f, bw, opt = profile.forward_s, profile.backward_s, profile.optimizer_s
    p = net.world_size
    blocks = hook_blocks_backward and compressor not in ASYNC_COMPRESSORS
    straggler = slowest_rank_s(profile, net)
    if p == 1:
        return _decide(profile, compressor, net, blocks, Composition(f + bw + opt, 0.0, 0.0, 0.0, (), 0.0, 0.0, bw),
                       straggler, None, comm_rel_spread)  # fmt: skip
    here = compose(profile, compressor, net, blocks)
    in_lockstep = profile.colocated_ranks == p > 1
    floors = []
    if comp.lockstep_comm_s is not None and in_lockstep:
        floors.append(f + bw + opt + here.encode_s + here.decode_s + comp.lockstep_comm_s)
    if comp.lockstep_step_s is not None and in_lockstep:
        floors.append(comp.lockstep_step_s)
    floor, at_free_link = None, False
    if floors:  # measured on a free link: the link's own addition at this rate comes on top
        free = compose(profile, compressor, replace(net, bandwidth_bps=max(FREE_LINK_BPS, net.bandwidth_bps)), blocks)
        added = max(0.0, here.iter_s - free.iter_s)
        floor = max(floors) + added
        at_free_link = added <= FREE_LINK_SHARE * here.iter_s
    return _decide(profile, compressor, net, blocks, here, straggler, floor, comm_rel_spread, at_free_link)


@dataclass(frozen=True)
class Composition:
    """The composition of the profile's phases on a network (no straggler, no floor)."""

    iter_s: float
    encode_s: float
    comm_s: float
    decode_s: float
    timeline: tuple[BucketTimeline, ...]
    host_s: float  # the collectives' host time (calibrated k and gamma), all buckets
    wire_s: float  # their bandwidth terms, all buckets
    # from backward's start: when its compute is through (slowed by the host share of the collectives beside it, with
    # the hooks' encodes and the decodes that landed before); the rest of the backward phase is the tail after it
    compute_end_s: float = 0.0


def _decide(profile: Profile, compressor: str, net: Network, blocks: bool, c: Composition, straggler: float,
            floor: float | None, comm_rel_spread: float, at_free_link: bool = False) -> Prediction:  # fmt: skip
    """The prediction from the composition, the straggler term and the floor: its breakdown, what bound it, its
    interval, and whether the floor decides (whenever above the composition, and `at_free_link` below it too)."""
    f, bw, opt = profile.forward_s, profile.backward_s, profile.optimizer_s
    compute = f + bw + opt
    composed = c.iter_s + straggler
    codec = min(max(0.0, c.iter_s - compute), c.encode_s + c.decode_s)
    exposed = max(0.0, c.iter_s - compute - codec)
    colocation = 0.0
    if profile.colocated_ranks > 1 and profile.solo_compute_s is not None:
        colocation = min(compute, max(0.0, compute - profile.solo_compute_s))
    host_bound = c.host_s > c.wire_s
    parts = {
        "compute": compute - colocation,
        "co-location": colocation,
        "codec": codec,
        "exposed communication": 0.0 if host_bound else exposed,
        "host cost": exposed if host_bound else 0.0,
        "skew": straggler,
        "floor": 0.0,
    }
    half = math.hypot(profile.relative_spread * (compute + codec), max(0.0, comm_rel_spread) * exposed)
    # the floor's own uncertainty: how far it moved between the launches pooled into the profile (the interval
    # reaches its top). A floor above the composition decides, and says so: measured whole, in place, it holds what
    # the sum of the phases' medians leaves out (seeds 2 and 3 of issue 32, rescored: deciding only above the
    # composition's interval left the PowerSGD 6-12 % short of its trials with its floor within 1-4 %)
    floor_half = profile.compressor(compressor).floor_spread_s or 0.0
    iter_s, note = composed, ""
    if floor is not None and floor > composed:
        iter_s = floor
        parts["floor"] = floor - composed
        why = ("within the two's spreads: the step measured whole is taken over the sum of its phases' medians"
               if floor - floor_half <= composed + half else
               "what the medians leave out when ranks time-share cores (a peer's codec in this rank's step, waits at "
               "the collectives)")  # fmt: skip
        note = (f"the floor measured in place ({floor * 1e3:.0f} ms) decides: the composition ({composed * 1e3:.0f} "
                f"ms, +-{half * 1e3:.0f} ms) falls {(floor - composed) * 1e3:.0f} ms short, {why}")  # fmt: skip
    elif floor is not None and at_free_link and floor < composed:
        # the link adds nothing here: the step measured whole, in place, on the same links is this very step (seeds 7
        # and 8 of issue 32: unshaped sync SGD composed 6.8-26.5 % above its trials, charging the collectives' host
        # work to backward, where its in-place step came within 1.7-6.6 % but for one slow profile)
        iter_s = floor
        parts["floor"] = floor - composed  # negative: what the measurement takes off the composition
        note = (f"the floor measured in place ({floor * 1e3:.0f} ms) decides: the link adds nothing to the "
                f"composition at this rate, so the step measured whole on the same links is this step; the "
                f"composition ({composed * 1e3:.0f} ms, +-{half * 1e3:.0f} ms) lies {(composed - floor) * 1e3:.0f} ms "
                "above it")  # fmt: skip
    bound = "floor" if parts["floor"] != 0 else max(parts, key=lambda k: parts[k])
    high = iter_s + half if floor is None else max(iter_s + half, floor + floor_half, composed + half)
    return Prediction(
        compressor,
        net.world_size,
        net.bandwidth_bps,
        iter_s,
        f,
        bw,
        opt,
        c.encode_s,
        c.comm_s,
        c.decode_s,
        net.world_size * profile.batch_size / iter_s if iter_s > 0 else math.inf,
        blocks,
        c.timeline,
        straggler,
        composed,
        bound,
        tuple((k, v) for k, v in parts.items() if v != 0),
        floor,
        note,
        max(0.0, min(iter_s, composed) - half),
        high,
        c.compute_end_s,
    )


def compose(profile: Profile, compressor: str, net: Network, blocks: bool) -> Composition:
    """The composition of one iteration's phases (module docstring, points 1-3 and 5), before stragglers and
    floors."""
    comp = profile.compressor(compressor)
    f, bw, opt = profile.forward_s, profile.backward_s, profile.optimizer_s
    host_total = sum(collective_host_s(comp.collective, c.payload_bytes, net) for c in comp.buckets)
    wire_total = sum(collective_time_s(comp.collective, c.payload_bytes, comp.rounds,
                                       replace(net, host_s_per_wire_byte=0.0, reduce_s_per_byte=0.0, latency_s=0.0,
                                               contention_latency_s=0.0, contention_s_per_wire_byte=0.0))
                     for c in comp.buckets)  # fmt: skip
    codec = {b.index: b for b in comp.buckets}
    timeline: list[BucketTimeline] = []
    enc_total = comm_total = dec_total = 0.0
    if blocks:
        stall = 0.0  # how long the backward stream has been held by hooks so far
        end = 0.0
        for g in profile.buckets:
            c = codec[g.index]
            # the hook holds the backward stream: no compute of this rank runs beside the collective
            comm = collective_time_s(comp.collective, c.payload_bytes, comp.rounds, net, beside_compute_s=0.0)
            start = max(g.ready_at_s + stall, end)
            comm_start = start + c.encode_s
            end = comm_start + comm + c.decode_s
            stall = end - g.ready_at_s
            timeline.append(BucketTimeline(g.index, start, comm_start, comm_start + comm, end))
            enc_total, comm_total, dec_total = enc_total + c.encode_s, comm_total + comm, dec_total + c.decode_s
        backward_end = max(bw + stall, end)
        compute_end = backward_end  # every collective was waited inside the hooks: no tail
    else:
        now = prev_ready = link_free = 0.0  # now: the compute cursor (backward + encode + landed decodes)
        pending: list[tuple[float, float, int]] = []  # (comm_end, decode_s, position in timeline), link order
        done_at: dict[int, float] = {}
        busy: list[tuple[float, float, float]] = []  # (comm_start, comm_end, host share) of each collective

        def run_backward(now: float, compute_s: float) -> float:
            """Backward compute of `compute_s`, slowed by the host share of collectives running beside it and
            interrupted by every decode that lands before it is through."""
            while pending and pending[0][0] <= compute_finish_s(now, compute_s, busy):
                avail, dec, pos = pending.pop(0)
                start = max(avail, now)
                compute_s -= compute_done_between(now, start, busy)
                now = start + dec
                done_at[pos] = now
            return compute_finish_s(now, compute_s, busy)

        for g in profile.buckets:
            c = codec[g.index]
            now = run_backward(now, max(0.0, g.ready_at_s - prev_ready))
            prev_ready = max(prev_ready, g.ready_at_s)
            start = now
            now += c.encode_s
            comm_start = max(now, link_free)
            # the backward compute still to run beside it (an estimate: before the slowdowns it will meet)
            compute_left = max(0.0, now + (bw - prev_ready) - comm_start)
            comm = collective_time_s(comp.collective, c.payload_bytes, comp.rounds, net, beside_compute_s=compute_left)
            link_free = comm_start + comm
            host = collective_host_s(comp.collective, c.payload_bytes, net)
            if host > 0 and comm > 0:
                busy.append((comm_start, link_free, host / comm))
            pending.append((link_free, c.decode_s, len(timeline)))
            timeline.append(BucketTimeline(g.index, start, comm_start, link_free, link_free + c.decode_s))
            enc_total, comm_total, dec_total = enc_total + c.encode_s, comm_total + comm, dec_total + c.decode_s
        now = run_backward(now, max(0.0, bw - prev_ready))
        compute_end = now
        for avail, dec, pos in pending:  # decodes after backward compute, in arrival order
            now = max(now, avail) + dec
            done_at[pos] = now
        timeline = [replace(t, done_s=done_at[i]) for i, t in enumerate(timeline)]
        backward_end = now
    return Composition(f + backward_end + opt, enc_total, comm_total, dec_total, tuple(timeline), host_total,
                       wire_total, compute_end)


def predict_curves(
    profile: Profile,
    world_size: int,
    bandwidths_bps: Sequence[float],
    *,
    compressors: Sequence[str] | None = None,
    terms: Terms = None,
    hook_blocks_backward: bool = False,
    comm_rel_spread: float = 0.0,
) -> dict[str, list[Prediction]]:
    """Predicted iteration per compressor (default: all profiled, plus syncsgd) at each bandwidth. `terms`: the
    collective terms (latency, efficiency, host and contention costs) as a Network whose world size and bandwidth
    are replaced by the arguments'; default: none of them (plain alpha-beta with alpha 0)."""
    names = list(compressors) if compressors else profile.compressor_names()
    return {
        name: [
            predict_iteration(profile, name, at(terms, world_size, b), hook_blocks_backward=hook_blocks_backward,
                              comm_rel_spread=comm_rel_spread)
            for b in bandwidths_bps
        ]
        for name in names
    }


Terms = Network | Callable[[float], Network] | None
"""The collective terms of a prediction: one Network for every bandwidth, or a function of the bandwidth (terms
calibrated at several rates, interpolated between them), or None for the defaults."""


def at(terms: Terms, world_size: int, bandwidth_bps: float) -> Network:
    """`terms` (a Network used as the collective terms, or a function of the bandwidth giving one) for
    `world_size` workers at `bandwidth_bps`."""
    if terms is None:
        return Network(int(world_size), float(bandwidth_bps))
    if callable(terms):
        terms = terms(float(bandwidth_bps))
    return replace(terms, world_size=int(world_size), bandwidth_bps=float(bandwidth_bps))
