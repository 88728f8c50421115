"""Profiles: what one rank of a workload costs on one device (forward, backward, optimizer, DDP bucket readiness)
and what each compressor does to every bucket (payload, encode, decode). The `testbed.profile/1` schema, its JSON
files (`<workload>-bs<batch>-<device>[-colocated<N>].json`), the choice of profile for a prediction and the pooling
of repeated measurements. Pure; measuring one is testbed/modelling.py's (runners/profile.py inside the rank)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import Any

from runners import catalog
from testbed.errors import InputError, why_not_a_file
from testbed.perfmodel.collectives import COLLECTIVES

PROFILE_SCHEMA = "testbed.profile/1"
# the built-in compressors in the catalogue's order (runners/catalog.py: their one home)
COMPRESSORS: tuple[str, ...] = tuple(catalog.names())
BASELINES: tuple[str, ...] = catalog.DENSE_BASELINES  # what a speedup may be taken over


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
    # co-located ranks trained with this compressor in lockstep on loopback or on a cluster's unshaped links (testbed
    # profile --on); a floor for any link (None: not measured)
    lockstep_comm_s: float | None = None
    # and the whole step it took there (the slowest rank's, median over steps), a floor for any link
    lockstep_step_s: float | None = None
    # half the range of those floors over the repeated profiles pooled into this one (`pool_profiles`; the larger of
    # the two floors' half-ranges): how far one launch's floor moves from the next (None: one measurement)
    floor_spread_s: float | None = None

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
    # the emulated cluster whose hosts ran the co-located ranks, gloo over its links (testbed profile --on NAME);
    # None: this machine's processes, gloo over loopback
    colocated_on: str | None = None
    compute_jitter_s: float = 0.0  # spread of one rank's forward + backward + optimizer from iteration to iteration
    # co-located profiles: per step started together, the slowest rank's lateness behind the median one (None: not
    # measured)
    lockstep_skew_s: float | None = None
    # co-located profiles: forward + backward + optimizer of the solo profile, measured alone (co-location's slowdown
    # is the compute beyond it: a term of its own in a prediction's breakdown); None: not recorded
    solo_compute_s: float | None = None
    # half the range of forward + backward + optimizer over the repeated profiles pooled into this one
    # (`pool_profiles`); None: one measurement (the interval then uses the iteration-to-iteration spread)
    compute_spread_s: float | None = None

    @property
    def relative_spread(self) -> float:
        """The profile's relative uncertainty, for a prediction's interval: the spread of the repeats pooled into it
        (`compute_spread_s`), at least the iteration-to-iteration spread of a trial's median over 5 steps
        (`compute_jitter_s` / sqrt 5), as a fraction of the compute."""
        if self.compute_s <= 0:
            return 0.0
        jitter = self.compute_jitter_s / math.sqrt(5)
        return max(jitter, self.compute_spread_s or 0.0) / self.compute_s

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
            floor, step_floor, spread = c.get("lockstep_comm_s"), c.get("lockstep_step_s"), c.get("floor_spread_s")
            comps[name] = CompressorProfile(name, collective, rounds, cb, dict(c.get("options") or {}),
                                            tuple(str(a) for a in c.get("assumed") or ()),
                                            None if floor is None else max(0.0, float(floor)),
                                            None if step_floor is None else max(0.0, float(step_floor)),
                                            None if spread is None else max(0.0, float(spread)))  # fmt: skip
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
            colocated_on=None if d.get("colocated_on") is None else str(d["colocated_on"]),
            compute_jitter_s=max(0.0, float(d.get("compute_jitter_s", 0.0))),
            lockstep_skew_s=None if d.get("lockstep_skew_s") is None else max(0.0, float(d["lockstep_skew_s"])),
            solo_compute_s=None if d.get("solo_compute_s") is None else max(0.0, float(d["solo_compute_s"])),
            compute_spread_s=None if d.get("compute_spread_s") is None else max(0.0, float(d["compute_spread_s"])),
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

    def floor_spread(name: str) -> float | None:
        """The larger half-range of the compressor's two in-place floors over the profiles (None: one profile, or
        neither floor measured in all of them)."""
        if len(profiles) == 1:
            return first.compressors[name].floor_spread_s
        halves = [(max(v) - min(v)) / 2 for v in ([p.compressors[name].lockstep_comm_s for p in profiles],
                                                   [p.compressors[name].lockstep_step_s for p in profiles])
                  if None not in v]  # fmt: skip
        return max(halves) if halves else None

    comps = {
        name: replace(c, buckets=tuple(
            replace(b, encode_s=med(p.compressors[name].buckets[i].encode_s for p in profiles),
                    decode_s=med(p.compressors[name].buckets[i].decode_s for p in profiles))
            for i, b in enumerate(c.buckets)),
            lockstep_comm_s=med_or_none([p.compressors[name].lockstep_comm_s for p in profiles]),
            lockstep_step_s=med_or_none([p.compressors[name].lockstep_step_s for p in profiles]),
            floor_spread_s=floor_spread(name))  # fmt: skip
        for name, c in first.compressors.items()
    }
    return replace(
        first,
        forward_s=med(p.forward_s for p in profiles),
        backward_s=med(p.backward_s for p in profiles),
        optimizer_s=med(p.optimizer_s for p in profiles),
        compute_jitter_s=med(p.compute_jitter_s for p in profiles),
        lockstep_skew_s=med_or_none([p.lockstep_skew_s for p in profiles]),
        solo_compute_s=med_or_none([p.solo_compute_s for p in profiles]),
        compute_spread_s=(max(p.compute_s for p in profiles) - min(p.compute_s for p in profiles)) / 2
        if len(profiles) > 1 else first.compute_spread_s,
        buckets=buckets,
        compressors=comps,
    )



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
        **({} if profile.colocated_on is None else {"colocated_on": profile.colocated_on}),
        "compute_jitter_s": profile.compute_jitter_s,
        **({} if profile.lockstep_skew_s is None else {"lockstep_skew_s": profile.lockstep_skew_s}),
        **({} if profile.solo_compute_s is None else {"solo_compute_s": profile.solo_compute_s}),
        **({} if profile.compute_spread_s is None else {"compute_spread_s": profile.compute_spread_s}),
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
                **({} if c.floor_spread_s is None else {"floor_spread_s": c.floor_spread_s}),
            }
            for n, c in profile.compressors.items()
        },
    }
