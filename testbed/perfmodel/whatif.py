"""What-if knobs: the same profile on faster compute or faster codecs, or without overlap. More workers and another
workload are arguments of the predictors (world_size, profile)."""

from __future__ import annotations

from dataclasses import replace

from testbed.errors import InputError
from testbed.perfmodel.profiles import Profile


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
        solo_compute_s=None if profile.solo_compute_s is None else profile.solo_compute_s / k,
        compute_spread_s=None if profile.compute_spread_s is None else profile.compute_spread_s / k,
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
    comps = {n: replace(c, lockstep_comm_s=None, lockstep_step_s=None, floor_spread_s=None) for n, c in profile.compressors.items()}
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
