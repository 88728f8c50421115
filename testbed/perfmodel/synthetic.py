"""Synthetic profiles: a `testbed.profile/1` dict from a handful of numbers, for docs, demos and tests."""

from __future__ import annotations

from collections.abc import Mapping

from runners import catalog
from testbed.perfmodel.profiles import PROFILE_SCHEMA

# name: (payload/grad ratio, encode_s, decode_s) for the whole workload; plausible CPU magnitudes for a
# ResNet-18-sized workload, meant for docs, demos and tests, not as measurements. Every built-in compressor has one
# (tests/unit/testbed/perfmodel/test_prediction.py checks); its collective and rounds are the catalogue's (runners/catalog.py).
_SYNTHETIC_COSTS: dict[str, tuple[float, float, float]] = {
    "syncsgd": (1.0, 0.0, 0.0),
    "fp16": (0.5, 0.002, 0.002),
    "bf16": (0.5, 0.002, 0.002),
    "powersgd": (0.01, 0.020, 0.010),
    "acpsgd": (0.005, 0.010, 0.005),
    "signsgd": (1 / 32, 0.005, 0.010),
    "topk": (0.02, 0.030, 0.010),
    "mstopk": (0.02, 0.010, 0.010),
}
# name: (collective, rounds, payload/grad ratio, encode_s, decode_s), in the catalogue's order
SYNTHETIC_CODECS: dict[str, tuple[str, int, float, float, float]] = {
    c.name: (c.collective, c.rounds, *_SYNTHETIC_COSTS[c.name]) for c in catalog.COMPRESSORS.values()
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
