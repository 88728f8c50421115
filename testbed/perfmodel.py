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
   1.63 s, the composition of the profile's medians 1.58 s).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist, median
from typing import Any

from shaping.units import format_rate
from testbed.errors import InputError, why_not_a_file

PROFILE_SCHEMA = "testbed.profile/1"
COMPRESSORS = ("syncsgd", "fp16", "bf16", "powersgd", "acpsgd", "signsgd", "topk", "mstopk")
COLLECTIVES = ("allreduce", "allgather")
# Compressors that overlap whatever the runner's --overlap says: syncsgd is DDP's built-in all-reduce (no hook).
# With --overlap off every hook (fp16 and bf16 too) waits inside the hook.
ASYNC_COMPRESSORS = frozenset({"syncsgd"})
BASELINES = ("syncsgd", "fp16", "bf16")


# --------------------------------------------------------------------------------------------- data classes
@dataclass(frozen=True)
class GradBucket:
    """One DDP gradient bucket, in reduction order. `ready_at_s` is measured from the start of backward."""

    index: int
    grad_bytes: int
    numel: int
    ready_at_s: float


@dataclass(frozen=True)
class CodecBucket:
    """What one compressor does to one bucket: bytes it sends (all rounds together) and its encode/decode time."""

    index: int
    payload_bytes: int
    encode_s: float
    decode_s: float


@dataclass(frozen=True)
class CompressorProfile:
    name: str
    collective: str  # "allreduce" | "allgather"
    rounds: int
    buckets: tuple[CodecBucket, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    assumed: tuple[str, ...] = ()  # what the profile assumed of a plugin that did not declare it
    # co-located profiles: the communication a step exposed (waits at the collectives with no codec work) while the
    # co-located ranks trained with this compressor in lockstep on loopback; a floor for any link (None: not measured)
    lockstep_comm_s: float | None = None
    # and the whole step it took there (the slowest rank's, median over steps), a floor for any link
    lockstep_step_s: float | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(b.payload_bytes for b in self.buckets)

    @property
    def encode_s(self) -> float:
        return sum(b.encode_s for b in self.buckets)

    @property
    def decode_s(self) -> float:
        return sum(b.decode_s for b in self.buckets)


@dataclass(frozen=True)
class Profile:
    """Per-iteration compute profile of one model at one batch size on one device, plus per-compressor costs."""

    model: str
    batch_size: int
    forward_s: float
    backward_s: float
    optimizer_s: float
    buckets: tuple[GradBucket, ...]
    compressors: Mapping[str, CompressorProfile]
    device: str = "cpu"
    image_size: int | None = None
    seq_len: int | None = None
    bucket_cap_mb: float = 25.0
    torch_version: str = ""
    hostname: str = ""
    colocated_ranks: int = 1  # ranks computing at once on the measuring machine (testbed profile --colocated)
    compute_jitter_s: float = 0.0  # spread of one rank's forward + backward + optimizer from iteration to iteration
    # co-located profiles: per step started together, the slowest rank's lateness behind the median one (None: not
    # measured)
    lockstep_skew_s: float | None = None

    @property
    def grad_bytes(self) -> int:
        return sum(b.grad_bytes for b in self.buckets)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    def compressor(self, name: str) -> CompressorProfile:
        """The named compressor's costs. `syncsgd` is derived from the buckets when the profile lacks it."""
        if name in self.compressors:
            return self.compressors[name]
        if name == "syncsgd":
            return CompressorProfile(
                "syncsgd",
                "allreduce",
                1,
                tuple(CodecBucket(b.index, b.grad_bytes, 0.0, 0.0) for b in self.buckets),
            )
        raise InputError(
            f"compressor {name!r} is not in the profile of {self.model} (bs {self.batch_size}); "
            f"profiled: {', '.join(self.compressor_names()) or 'none'}"
        )

    def compressor_names(self) -> list[str]:
        names = list(self.compressors)
        if "syncsgd" not in names:
            names.insert(0, "syncsgd")
        order = {n: i for i, n in enumerate(COMPRESSORS)}
        return sorted(names, key=lambda n: (order.get(n, len(order)), n))


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

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def exposed_s(self) -> float:
        """Time the iteration spends beyond pure compute (communication and codec work that was not hidden)."""
        return self.iter_time_s - self.compute_s


@dataclass(frozen=True)
class Crossover:
    """Where a compressor's predicted time equals the baseline's, within [low_bps, high_bps].

    kind: "crossover" (bandwidth_bps set), "always" (compressor faster across the range), "never" (never faster).
    wins_below: for a crossover, True when the compressor is faster below `bandwidth_bps` (the usual case).
    """

    compressor: str
    baseline: str
    kind: str
    bandwidth_bps: float | None
    low_bps: float
    high_bps: float
    wins_below: bool | None = None
    crossings_bps: tuple[float, ...] = ()

    def describe(self, fmt: Callable[[float], str] | None = None) -> str:
        fmt = fmt or rate_text
        if self.kind == "always":
            return f"always faster ({fmt(self.low_bps)}..{fmt(self.high_bps)})"
        if self.kind == "never":
            return f"never faster ({fmt(self.low_bps)}..{fmt(self.high_bps)})"
        side = "below" if self.wins_below else "above"
        return f"{fmt(self.bandwidth_bps)} (faster {side})"


def rate_text(bps: float) -> str:
    """A rate as the model prints it: shaping.units.format_rate with 3 significant digits (1.23gbit)."""
    return format_rate(bps, digits=3)


# --------------------------------------------------------------------------------------------- profiles I/O
def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise InputError(f"{where}: missing key {key!r} (schema {PROFILE_SCHEMA})")
    return d[key]


def profile_from_dict(d: Mapping[str, Any], source: str = "profile") -> Profile:
    """Validate and convert a `testbed.profile/1` JSON object."""
    if not isinstance(d, Mapping):
        raise InputError(f"{source}: expected a JSON object, got {type(d).__name__}")
    schema = d.get("schema")
    if schema != PROFILE_SCHEMA:
        raise InputError(f"{source}: schema {schema!r} is not supported; expected {PROFILE_SCHEMA!r}")
    try:
        buckets = tuple(
            GradBucket(
                int(_req(b, "index", source)),
                int(_req(b, "grad_bytes", source)),
                int(b.get("numel", 0)),
                float(_req(b, "ready_at_s", source)),
            )
            for b in _req(d, "buckets", source)
        )
        if not buckets:
            raise InputError(f"{source}: 'buckets' is empty; expected at least one DDP bucket")
        comps: dict[str, CompressorProfile] = {}
        for name, c in (d.get("compressors") or {}).items():
            where = f"{source}: compressor {name!r}"
            collective = _req(c, "collective", where)
            if collective not in COLLECTIVES:
                raise InputError(f"{where}: collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
            rounds = int(_req(c, "rounds", where))
            if rounds < 1:
                raise InputError(f"{where}: rounds {rounds}; expected >= 1")
            cb = tuple(
                CodecBucket(
                    int(_req(b, "index", where)),
                    int(_req(b, "payload_bytes", where)),
                    float(b.get("encode_s", 0.0)),
                    float(b.get("decode_s", 0.0)),
                )
                for b in _req(c, "buckets", where)
            )
            missing = {b.index for b in buckets} - {b.index for b in cb}
            if missing:
                raise InputError(f"{where}: no entry for bucket(s) {sorted(missing)}; expected one per DDP bucket")
            floor, step_floor = c.get("lockstep_comm_s"), c.get("lockstep_step_s")
            comps[name] = CompressorProfile(name, collective, rounds, cb, dict(c.get("options") or {}),
                                            tuple(str(a) for a in c.get("assumed") or ()),
                                            None if floor is None else max(0.0, float(floor)),
                                            None if step_floor is None else max(0.0, float(step_floor)))  # fmt: skip
        return Profile(
            model=str(_req(d, "model", source)),
            batch_size=int(_req(d, "batch_size", source)),
            forward_s=float(_req(d, "forward_s", source)),
            backward_s=float(_req(d, "backward_s", source)),
            optimizer_s=float(d.get("optimizer_s", 0.0)),
            buckets=buckets,
            compressors=comps,
            device=str(d.get("device", "cpu")),
            image_size=d.get("image_size"),
            seq_len=d.get("seq_len"),
            bucket_cap_mb=float(d.get("bucket_cap_mb", 25.0)),
            torch_version=str(d.get("torch_version", "")),
            hostname=str(d.get("hostname", "")),
            colocated_ranks=int(d.get("colocated_ranks", 1)),
            compute_jitter_s=max(0.0, float(d.get("compute_jitter_s", 0.0))),
            lockstep_skew_s=None if d.get("lockstep_skew_s") is None else max(0.0, float(d["lockstep_skew_s"])),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{source}: malformed profile ({exc}); expected schema {PROFILE_SCHEMA}") from exc


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"profile {path}: {why_not_a_file(path)}; expected a JSON file written by `testbed profile`"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"profile {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return profile_from_dict(data, source=f"profile {path}")


def profile_filename(model: str, batch_size: int, device: str, colocated_ranks: int = 1) -> str:
    """`<model>-bs<batch>-<device>.json`; a co-located profile adds `-colocated<N>` (it is of another machine load)."""
    suffix = f"-colocated{colocated_ranks}" if colocated_ranks > 1 else ""
    return f"{model}-bs{batch_size}-{device}{suffix}.json"


def find_profiles(directory: str | Path) -> list[Profile]:
    """Every readable profile in a directory (unreadable files are skipped: the report notes what it used)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("*.json")):
        try:
            out.append(load_profile(p))
        except InputError:
            continue
    return out


def pick_profile(
    profiles: Iterable[Profile], model: str, batch_size: int | None = None, colocated_ranks: int | None = None
) -> Profile | None:
    """The profile for `model`: measured with `colocated_ranks` ranks computing at once if there is one (the report
    passes a trial group's world size: on the local emulated cluster every rank shares this machine), else a solo
    one, else any; among those the same batch size, then the closest one."""
    cands = [p for p in profiles if p.model == model]
    if not cands:
        return None

    def colocation_rank(p: Profile) -> int:
        if colocated_ranks is None or p.colocated_ranks == colocated_ranks:
            return 0
        return 1 if p.colocated_ranks == 1 else 2

    if batch_size is None:
        return min(cands, key=colocation_rank)
    return min(cands, key=lambda p: (colocation_rank(p), abs(p.batch_size - batch_size), p.batch_size))


def pool_profiles(profiles: Sequence[Profile]) -> Profile:
    """One profile from several measurements of the same thing (same model, batch, device, co-location, bucket
    layout and compressors), each time the median: forward, backward, optimizer, spread, every bucket's ready time,
    every codec's encode and decode. For profiles taken at intervals between trials, so that the machine's drift
    over a sweep does not land on the model as a bias of whichever moment was profiled."""
    if not profiles:
        raise InputError("pool_profiles: no profile given; expected at least one")
    first = profiles[0]

    def key(p: Profile) -> tuple:
        layout = tuple((b.index, b.grad_bytes) for b in p.buckets)
        codecs = tuple(sorted((n, c.collective, c.rounds, tuple((b.index, b.payload_bytes) for b in c.buckets))
                              for n, c in p.compressors.items()))  # fmt: skip
        return p.model, p.batch_size, p.device, p.colocated_ranks, layout, codecs

    for p in profiles[1:]:
        if key(p) != key(first):
            raise InputError(
                f"pool_profiles: {p.model} bs{p.batch_size} ({p.device}, {p.colocated_ranks} co-located) differs from "
                f"{first.model} bs{first.batch_size} ({first.device}, {first.colocated_ranks} co-located) in model, "
                "batch, device, co-location, buckets or compressors; expected repeated measurements of one setting"
            )

    def med(values: Iterable[float]) -> float:
        return float(median(values))

    buckets = tuple(
        replace(b, ready_at_s=med(p.buckets[i].ready_at_s for p in profiles)) for i, b in enumerate(first.buckets)
    )
    def med_or_none(values: Sequence[float | None]) -> float | None:
        return None if any(v is None for v in values) else med(values)

    comps = {
        name: replace(c, buckets=tuple(
            replace(b, encode_s=med(p.compressors[name].buckets[i].encode_s for p in profiles),
                    decode_s=med(p.compressors[name].buckets[i].decode_s for p in profiles))
            for i, b in enumerate(c.buckets)),
            lockstep_comm_s=med_or_none([p.compressors[name].lockstep_comm_s for p in profiles]),
            lockstep_step_s=med_or_none([p.compressors[name].lockstep_step_s for p in profiles]))  # fmt: skip
        for name, c in first.compressors.items()
    }
    return replace(
        first,
        forward_s=med(p.forward_s for p in profiles),
        backward_s=med(p.backward_s for p in profiles),
        optimizer_s=med(p.optimizer_s for p in profiles),
        compute_jitter_s=med(p.compute_jitter_s for p in profiles),
        lockstep_skew_s=med_or_none([p.lockstep_skew_s for p in profiles]),
        buckets=buckets,
        compressors=comps,
    )


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
    profile: Profile, compressor: str, net: Network, *, hook_blocks_backward: bool = False
) -> Prediction:
    """Predicted time of one training iteration with `compressor` on `net` (see the module docstring).
    `hook_blocks_backward` True models the runner's `--overlap off`; False (default) its `--overlap on`."""
    comp = profile.compressor(compressor)
    f, bw, opt = profile.forward_s, profile.backward_s, profile.optimizer_s
    p = net.world_size
    blocks = hook_blocks_backward and compressor not in ASYNC_COMPRESSORS

    straggler = slowest_rank_s(profile, net)
    in_lockstep = profile.colocated_ranks == p > 1
    comm_floor = comp.lockstep_comm_s if comp.lockstep_comm_s is not None and in_lockstep else 0.0
    step_floor = comp.lockstep_step_s if comp.lockstep_step_s is not None and in_lockstep else 0.0

    def result(iter_s: float, enc: float, comm: float, dec: float, tl: tuple[BucketTimeline, ...]) -> Prediction:
        composed = iter_s + straggler
        iter_s = max(composed, f + bw + opt + enc + dec + comm_floor, step_floor)
        return Prediction(
            compressor,
            p,
            net.bandwidth_bps,
            iter_s,
            f,
            bw,
            opt,
            enc,
            comm,
            dec,
            p * profile.batch_size / iter_s if iter_s > 0 else math.inf,
            blocks,
            tl,
            straggler,
            composed,
        )

    if p == 1:
        return result(f + bw + opt, 0.0, 0.0, 0.0, ())

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
        for avail, dec, pos in pending:  # decodes after backward compute, in arrival order
            now = max(now, avail) + dec
            done_at[pos] = now
        timeline = [replace(t, done_s=done_at[i]) for i, t in enumerate(timeline)]
        backward_end = now
    return result(f + backward_end + opt, enc_total, comm_total, dec_total, tuple(timeline))


def predict_curves(
    profile: Profile,
    world_size: int,
    bandwidths_bps: Sequence[float],
    *,
    compressors: Sequence[str] | None = None,
    terms: Terms = None,
    hook_blocks_backward: bool = False,
) -> dict[str, list[Prediction]]:
    """Predicted iteration per compressor (default: all profiled, plus syncsgd) at each bandwidth. `terms`: the
    collective terms (latency, efficiency, host and contention costs) as a Network whose world size and bandwidth
    are replaced by the arguments'; default: none of them (plain alpha-beta with alpha 0)."""
    names = list(compressors) if compressors else profile.compressor_names()
    return {
        name: [
            predict_iteration(profile, name, at(terms, world_size, b), hook_blocks_backward=hook_blocks_backward)
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


def log_grid(low_bps: float, high_bps: float, points: int) -> list[float]:
    """`points` bandwidths evenly spaced in log between low and high, both included."""
    if not (0 < low_bps <= high_bps):
        raise InputError(f"bandwidth range {low_bps!r}..{high_bps!r}: expected 0 < low <= high")
    if points < 1:
        raise InputError(f"points {points}: expected >= 1")
    if points == 1 or low_bps == high_bps:
        return [float(low_bps)]
    step = math.log(high_bps / low_bps) / (points - 1)
    grid = [low_bps * math.exp(i * step) for i in range(points)]
    grid[-1] = float(high_bps)
    return grid


def find_crossover(
    diff: Callable[[float], float], low_bps: float, high_bps: float, *, points: int = 64, rel_tol: float = 1e-6
) -> tuple[str, float | None, bool | None, tuple[float, ...]]:
    """Roots of `diff(B) = t_compressor(B) - t_baseline(B)` on a log grid, refined by bisection in log(B).

    Returns (kind, bandwidth_bps, wins_below, all crossings). Compressor "wins" where diff < 0.
    With several crossings, the reported one is the highest win->lose crossing (the bandwidth above which the
    compressor stops paying), or else the lowest lose->win crossing.
    """
    grid = log_grid(low_bps, high_bps, max(points, 2))
    vals = [diff(b) for b in grid]
    wins = [v < 0 for v in vals]
    if all(wins):
        return "always", None, None, ()
    if not any(wins):
        return "never", None, None, ()
    crossings: list[tuple[float, bool]] = []
    for i in range(len(grid) - 1):
        if wins[i] == wins[i + 1]:
            continue
        lo, hi = grid[i], grid[i + 1]
        lo_wins = wins[i]
        while hi / lo > 1 + rel_tol:
            mid = math.sqrt(lo * hi)
            if (diff(mid) < 0) == lo_wins:
                lo = mid
            else:
                hi = mid
        crossings.append((math.sqrt(lo * hi), lo_wins))
    b_star, wins_below = choose_crossing(crossings)
    return "crossover", b_star, wins_below, tuple(b for b, _ in crossings)


def choose_crossing(crossings: Sequence[tuple[float, bool]]) -> tuple[float, bool]:
    """The crossover rule, for predicted and measured curves alike. `crossings` are (bandwidth, wins_below) in rising
    bandwidth. The reported one is the highest win->lose crossing (the bandwidth above which the compressor stops
    paying), or else the lowest lose->win crossing. Returns (bandwidth_bps, wins_below)."""
    win_to_lose = [b for b, wins_below in crossings if wins_below]
    if win_to_lose:
        return win_to_lose[-1], True
    return crossings[0][0], False


def crossover_from_samples(
    rates_bps: Sequence[float], speedups: Sequence[float]
) -> tuple[str, float | None, bool | None]:
    """Crossover of sampled speedups (compressor over baseline, > 1 wins) through 1.0, interpolated in log-log
    between neighbouring rates; the same rule as `find_crossover` picks among several crossings.

    Returns (kind, bandwidth_bps, wins_below): ("crossover", B, ...), ("always"/"never", None, None), or
    ("n/a", None, None) when fewer than two rates have a positive speedup.
    """
    pts = sorted(
        (r, s) for r, s in zip(rates_bps, speedups, strict=True) if r and r > 0 and s and s > 0 and not math.isnan(s)
    )
    if len(pts) < 2:
        return "n/a", None, None
    wins = [s > 1.0 for _, s in pts]
    if all(wins):
        return "always", None, None
    if not any(wins):
        return "never", None, None
    crossings = []
    for (r0, s0), (r1, s1), w0, w1 in zip(pts, pts[1:], wins, wins[1:], strict=False):
        if w0 == w1:
            continue
        d0, d1 = math.log(s0), math.log(s1)
        frac = d0 / (d0 - d1) if d0 != d1 else 0.5
        crossings.append((math.exp(math.log(r0) + frac * (math.log(r1) - math.log(r0))), w0))
    b_star, wins_below = choose_crossing(crossings)
    return "crossover", b_star, wins_below


def crossover(
    profile: Profile,
    compressor: str,
    world_size: int,
    low_bps: float,
    high_bps: float,
    *,
    baseline: str = "syncsgd",
    terms: Terms = None,
    hook_blocks_backward: bool = False,
    points: int = 64,
) -> Crossover:
    """Bandwidth B* in [low, high] where `compressor`'s predicted iteration time equals `baseline`'s (`terms` as in
    predict_curves)."""

    def t(name: str, b: float) -> float:
        return predict_iteration(
            profile, name, at(terms, world_size, b), hook_blocks_backward=hook_blocks_backward
        ).iter_time_s

    kind, b_star, wins_below, crossings = find_crossover(
        lambda b: t(compressor, b) - t(baseline, b), low_bps, high_bps, points=points
    )
    return Crossover(compressor, baseline, kind, b_star, float(low_bps), float(high_bps), wins_below, crossings)


@dataclass(frozen=True)
class SpeedupSummary:
    compressor: str
    baseline: str
    max_speedup: float
    at_bps: float
    crossover: Crossover


def summarize(
    profile: Profile,
    world_size: int,
    bandwidths_bps: Sequence[float],
    *,
    baseline: str = "syncsgd",
    compressors: Sequence[str] | None = None,
    terms: Terms = None,
    hook_blocks_backward: bool = False,
) -> dict[str, SpeedupSummary]:
    """Best speedup over `baseline` in the range, and the crossover, per compressor (`terms` as in predict_curves)."""
    names = list(compressors) if compressors else profile.compressor_names()
    curves = predict_curves(profile, world_size, bandwidths_bps, compressors=sorted(set(names) | {baseline}),
                            terms=terms, hook_blocks_backward=hook_blocks_backward)  # fmt: skip
    base = curves[baseline]
    lo, hi = min(bandwidths_bps), max(bandwidths_bps)
    out = {}
    for name in names:
        speedups = [b.iter_time_s / c.iter_time_s for b, c in zip(base, curves[name], strict=True)]
        i = max(range(len(speedups)), key=speedups.__getitem__)
        cx = (
            crossover(profile, name, world_size, lo, hi, baseline=baseline, terms=terms,
                      hook_blocks_backward=hook_blocks_backward)  # fmt: skip
            if lo < hi
            else Crossover(name, baseline, "always" if speedups[0] > 1 else "never", None, lo, hi)
        )
        out[name] = SpeedupSummary(name, baseline, speedups[i], float(bandwidths_bps[i]), cx)
    return out


# --------------------------------------------------------------------------------------------- what-if knobs
def with_compute_speedup(profile: Profile, k: float) -> Profile:
    """The same model on hardware whose forward, backward and optimizer run k times faster. The in-place floors go
    (`without_lockstep_floors`): they are this machine's steps; the measured lockstep skew, a spread of compute like
    the jitter, shrinks with it."""
    if not k > 0:
        raise InputError(f"compute speedup {k!r}: expected > 0")
    return replace(
        without_lockstep_floors(profile),
        forward_s=profile.forward_s / k,
        backward_s=profile.backward_s / k,
        optimizer_s=profile.optimizer_s / k,
        compute_jitter_s=profile.compute_jitter_s / k,
        lockstep_skew_s=None if profile.lockstep_skew_s is None else profile.lockstep_skew_s / k,
        buckets=tuple(replace(b, ready_at_s=b.ready_at_s / k) for b in profile.buckets),
    )


def with_codec_speedup(profile: Profile, k: float) -> Profile:
    """Encode and decode of every compressor k times faster (better kernels, not a different algorithm); the in-place
    floors go (`without_lockstep_floors`)."""
    if not k > 0:
        raise InputError(f"codec speedup {k!r}: expected > 0")
    comps = {
        name: replace(c, buckets=tuple(replace(b, encode_s=b.encode_s / k, decode_s=b.decode_s / k) for b in c.buckets))
        for name, c in without_lockstep_floors(profile).compressors.items()
    }
    return replace(profile, compressors=comps)


def without_lockstep_floors(profile: Profile) -> Profile:
    """The profile without its compressors' in-place floors (`CompressorProfile.lockstep_comm_s` and
    `lockstep_step_s`): what ranks time-sharing this machine's cores exposed and took bounds a prediction for this
    machine only, not one with faster compute or codecs (part of the exposed communication there is waiting for a
    peer's compute or codec)."""
    comps = {n: replace(c, lockstep_comm_s=None, lockstep_step_s=None) for n, c in profile.compressors.items()}
    return replace(profile, compressors=comps)


def serialized(profile: Profile) -> Profile:
    """No overlap (the runner's `--serial` mode): every bucket is handed over only when backward has finished."""
    return replace(profile, buckets=tuple(replace(b, ready_at_s=profile.backward_s) for b in profile.buckets))


def what_if(profile: Profile, *, compute_speedup: float = 1.0, codec_speedup: float = 1.0) -> Profile:
    """Both knobs at once. More workers and another model are arguments of the predictors (world_size, profile)."""
    out = profile
    if compute_speedup != 1.0:
        out = with_compute_speedup(out, compute_speedup)
    if codec_speedup != 1.0:
        out = with_codec_speedup(out, codec_speedup)
    return out


def fit_efficiency(predicted_comm_s: Sequence[float], measured_comm_s: Sequence[float]) -> float:
    """Efficiency that makes the model's bandwidth-bound communication time match measurement (median ratio).

    Pass communication times predicted at efficiency 1.0 (and no latency) and the measured ones of the same
    trials. The result is clamped to (0, 1].
    """
    ratios = sorted(p / m for p, m in zip(predicted_comm_s, measured_comm_s, strict=True) if m > 0 and p > 0)
    if not ratios:
        raise InputError("cannot fit efficiency: no trial with positive predicted and measured communication time")
    n = len(ratios)
    med = ratios[n // 2] if n % 2 else 0.5 * (ratios[n // 2 - 1] + ratios[n // 2])
    return min(1.0, max(1e-6, med))


# --------------------------------------------------------------------------------------------- synthetic profiles
# name: (collective, rounds, payload/grad ratio, encode_s, decode_s) for the whole model; plausible CPU magnitudes
# for a ResNet-18-sized model, meant for docs, demos and tests, not as measurements.
SYNTHETIC_CODECS: dict[str, tuple[str, int, float, float, float]] = {
    "syncsgd": ("allreduce", 1, 1.0, 0.0, 0.0),
    "fp16": ("allreduce", 1, 0.5, 0.002, 0.002),
    "bf16": ("allreduce", 1, 0.5, 0.002, 0.002),
    "powersgd": ("allreduce", 2, 0.01, 0.020, 0.010),
    "acpsgd": ("allreduce", 1, 0.005, 0.010, 0.005),
    "signsgd": ("allgather", 1, 1 / 32, 0.005, 0.010),
    "topk": ("allgather", 1, 0.02, 0.030, 0.010),
    "mstopk": ("allgather", 1, 0.02, 0.010, 0.010),
}


def synthetic_profile_dict(
    model: str = "synthetic",
    batch_size: int = 32,
    *,
    forward_s: float = 0.03,
    backward_s: float = 0.06,
    optimizer_s: float = 0.005,
    grad_bytes: int = 46_800_000,
    n_buckets: int = 2,
    codecs: Mapping[str, tuple[str, int, float, float, float]] | None = None,
    compute_jitter_s: float = 0.0,
) -> dict:
    """A `testbed.profile/1` dict built from a handful of numbers (buckets equal, ready evenly over backward).

    `codecs` maps compressor name to (collective, rounds, payload/grad ratio, encode_s, decode_s) totals.
    """
    codecs = SYNTHETIC_CODECS if codecs is None else codecs
    per = grad_bytes // n_buckets
    buckets = [
        {"index": i, "grad_bytes": per, "numel": per // 4, "ready_at_s": backward_s * (i + 1) / n_buckets}
        for i in range(n_buckets)
    ]
    comps = {
        name: {
            "options": {},
            "collective": coll,
            "rounds": rounds,
            "buckets": [
                {
                    "index": i,
                    "payload_bytes": int(per * ratio),
                    "encode_s": enc / n_buckets,
                    "decode_s": dec / n_buckets,
                }
                for i in range(n_buckets)
            ],
        }
        for name, (coll, rounds, ratio, enc, dec) in codecs.items()
    }
    return {
        "schema": PROFILE_SCHEMA,
        "model": model,
        "batch_size": batch_size,
        "image_size": None,
        "seq_len": None,
        "device": "cpu",
        "torch_version": "",
        "hostname": "synthetic",
        "bucket_cap_mb": 25.0,
        "colocated_ranks": 1,
        "compute_jitter_s": compute_jitter_s,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "optimizer_s": optimizer_s,
        "buckets": buckets,
        "compressors": comps,
    }


def profile_to_dict(profile: Profile) -> dict:
    """Inverse of `profile_from_dict` (for storing a profile after a what-if)."""
    return {
        "schema": PROFILE_SCHEMA,
        "model": profile.model,
        "batch_size": profile.batch_size,
        "image_size": profile.image_size,
        "seq_len": profile.seq_len,
        "device": profile.device,
        "torch_version": profile.torch_version,
        "hostname": profile.hostname,
        "bucket_cap_mb": profile.bucket_cap_mb,
        "colocated_ranks": profile.colocated_ranks,
        "compute_jitter_s": profile.compute_jitter_s,
        **({} if profile.lockstep_skew_s is None else {"lockstep_skew_s": profile.lockstep_skew_s}),
        "forward_s": profile.forward_s,
        "backward_s": profile.backward_s,
        "optimizer_s": profile.optimizer_s,
        "buckets": [
            {"index": b.index, "grad_bytes": b.grad_bytes, "numel": b.numel, "ready_at_s": b.ready_at_s}
            for b in profile.buckets
        ],
        "compressors": {
            n: {
                "options": dict(c.options),
                "collective": c.collective,
                "rounds": c.rounds,
                "buckets": [
                    {"index": b.index, "payload_bytes": b.payload_bytes, "encode_s": b.encode_s, "decode_s": b.decode_s}
                    for b in c.buckets
                ],
                **({"assumed": list(c.assumed)} if c.assumed else {}),
                **({} if c.lockstep_comm_s is None else {"lockstep_comm_s": c.lockstep_comm_s}),
                **({} if c.lockstep_step_s is None else {"lockstep_step_s": c.lockstep_step_s}),
            }
            for n, c in profile.compressors.items()
        },
    }
