"""testbed.modelling.merge_lockstep: what a co-located profile takes from its ranks measured together in lockstep."""

from __future__ import annotations

import pytest

from testbed import errors
from testbed.modelling import merge_lockstep
from testbed.perfmodel import profile_from_dict, synthetic_profile_dict

# solo totals (collective, rounds, payload ratio, encode_s, decode_s), spread over 2 buckets
CODECS = {"syncsgd": ("allreduce", 1, 1.0, 0.0, 0.0), "signsgd": ("allgather", 1, 1 / 32, 0.080, 0.150),
          "topk": ("allgather", 1, 0.02, 0.250, 0.010)}  # fmt: skip


def solo() -> dict:
    return synthetic_profile_dict("resnet18", 32, forward_s=0.10, backward_s=0.20, optimizer_s=0.02, codecs=CODECS)


def in_place(backward_s, encode_s, decode_s, comm_s, step_s=None) -> dict:
    phases = {"forward_s": 0.12, "backward_s": backward_s, "encode_s": encode_s, "comm_s": comm_s,
              "decode_s": decode_s, "optimizer_s": 0.025}  # fmt: skip
    return {**phases, "step_s": sum(phases.values()) if step_s is None else step_s}


def lockstep(**codecs) -> dict:
    return {"world_size": 2, "forward_s": 0.12, "backward_s": 0.25, "optimizer_s": 0.025, "compute_jitter_s": 0.004,
            "ready_at_s": {"0": 0.09, "1": 0.24}, "skew_s": [0.001, 0.009, 0.003], "codecs": codecs}  # fmt: skip


def totals(merged: dict, name: str) -> tuple[float, float]:
    buckets = merged["compressors"][name]["buckets"]
    return sum(b["encode_s"] for b in buckets), sum(b["decode_s"] for b in buckets)


def test_compute_spread_skew_and_bucket_readiness_come_from_the_lockstep_ranks():
    merged = merge_lockstep(solo(), lockstep())
    assert (merged["forward_s"], merged["backward_s"], merged["optimizer_s"]) == (0.12, 0.25, 0.025)
    assert merged["compute_jitter_s"] == 0.004
    assert merged["lockstep_skew_s"] == 0.003  # the median step
    assert [(b["index"], b["ready_at_s"]) for b in merged["buckets"]] == [(0, 0.09), (1, 0.24)]
    assert profile_from_dict(merged).lockstep_skew_s == 0.003


def test_codecs_take_their_in_place_cost_decode_plus_what_it_lengthened_backward_by():
    # Sign-SGD: backward 0.37 s beside its (and its peers') callback decodes against 0.25 s without; decode = 0.07 s
    # exposed + the whole 0.12 s (no cap by the rank's own callback CPU: a peer's decode lengthens it too)
    merged = merge_lockstep(solo(), lockstep(signsgd=in_place(0.37, 0.10, 0.07, 0.040)))
    enc, dec = totals(merged, "signsgd")
    assert enc == pytest.approx(0.10) and dec == pytest.approx(0.19)
    buckets = merged["compressors"]["signsgd"]["buckets"]
    assert buckets[0]["decode_s"] == pytest.approx(buckets[1]["decode_s"])  # the solo split between buckets stays
    assert merged["compressors"]["signsgd"]["lockstep_comm_s"] == 0.040
    assert merged["compressors"]["signsgd"]["lockstep_step_s"] == pytest.approx(0.12 + 0.37 + 0.10 + 0.07 + 0.04 + 0.025)
    assert merged["compressors"]["signsgd"]["buckets"][0]["payload_bytes"] == solo()["compressors"]["signsgd"][
        "buckets"][0]["payload_bytes"]  # fmt: skip


def test_what_a_plain_all_reduce_lengthened_backward_by_is_not_the_codecs():
    # sync SGD's built-in all-reduce in place: backward 0.31 s against 0.25 s alone, its own host work (the
    # calibration prices it); Top-K's backward 0.33 s: only 0.02 s beyond it is charged to its decode
    merged = merge_lockstep(solo(), lockstep(syncsgd=in_place(0.31, 0.0, 0.0, 0.030),
                                             topk=in_place(0.33, 0.24, 0.004, 0.005)))  # fmt: skip
    enc, dec = totals(merged, "topk")
    assert enc == pytest.approx(0.24) and dec == pytest.approx(0.024)
    # a sync SGD backward shorter than the lockstep compute's (noise) does not add to anyone's decode
    merged = merge_lockstep(solo(), lockstep(syncsgd=in_place(0.22, 0.0, 0.0, 0.030),
                                             topk=in_place(0.26, 0.24, 0.004, 0.005)))  # fmt: skip
    assert totals(merged, "topk")[1] == pytest.approx(0.014)


def test_compressors_not_measured_in_place_scale_by_the_compute_slowdown():  # a plugin on CUDA
    merged = merge_lockstep(solo(), lockstep())  # no in-place codecs (a plugin on CUDA)
    slowdown = (0.12 + 0.25 + 0.025) / (0.10 + 0.20 + 0.02)
    enc, dec = totals(merged, "signsgd")
    assert enc == pytest.approx(0.080 * slowdown) and dec == pytest.approx(0.150 * slowdown)
    assert "lockstep_comm_s" not in merged["compressors"]["signsgd"]
    assert "lockstep_step_s" not in merged["compressors"]["signsgd"]


def test_other_buckets_than_the_solo_profile_are_refused():
    bad = {**lockstep(), "ready_at_s": {"0": 0.1, "1": 0.2, "2": 0.3}}
    with pytest.raises(errors.TestbedError, match="other DDP buckets"):
        merge_lockstep(solo(), bad)


def test_a_stored_colocated_profile_is_named_by_the_file_it_came_from(tmp_path):
    """`predict` without --profile finds a co-located profile stored for the model and batch size, and says which
    file it read (it once named `<model>-bs<b>-cpu.json`, which did not exist, for `...-colocated4.json`)."""
    from testbed import perfmodel as pm
    from testbed.modelling import resolve_profile, save_profile

    prof = pm.profile_from_dict({**solo(), "colocated_ranks": 4}, source="test")
    stored = save_profile(prof, tmp_path)
    got, source = resolve_profile(profile_path=None, model="resnet18", batch_size=32, device="cpu",
                                  profiles_dir=tmp_path)  # fmt: skip
    assert got.colocated_ranks == 4
    assert source == str(stored) and stored.name == "resnet18-bs32-cpu-colocated4.json"
