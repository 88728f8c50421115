"""Issue 32: each prediction says what bound it, carries an interval, shows a measured floor beside the composition
(deciding whenever above the composition, and saying so), follows the link under a floor, and names co-location."""

from __future__ import annotations

import pytest

from testbed.perfmodel import (
    BOUND_TERMS,
    Network,
    crossover_interval,
    is_extrapolated,
    pool_profiles,
    predict_iteration,
    profile_from_dict,
    profile_to_dict,
    synthetic_profile_dict,
    with_compute_speedup,
)
from testbed.report.analysis import interval_verdict


def profile(**extra):
    return profile_from_dict({**synthetic_profile_dict(), **extra})


def test_each_prediction_names_the_term_that_bound_it():
    p = profile()
    fast = predict_iteration(p, "syncsgd", Network(2, 100e9))
    slow = predict_iteration(p, "syncsgd", Network(2, 10e6))
    assert fast.bound_by == "compute" and slow.bound_by == "exposed communication"
    for pred in (fast, slow):
        parts = dict(pred.breakdown)
        assert set(parts) <= set(BOUND_TERMS)
        assert sum(parts.values()) == pytest.approx(pred.iter_time_s)
    # host-bound collectives (calibrated host cost above the wire time) say so
    host = predict_iteration(p, "syncsgd", Network(2, 100e9, host_s_per_wire_byte=1e-8))
    assert dict(host.breakdown).get("host cost", 0) > 0


def test_co_location_is_a_term_of_its_own():
    p = profile(colocated_ranks=3, solo_compute_s=0.5 * (synthetic_profile_dict()["forward_s"]
                                                           + synthetic_profile_dict()["backward_s"]))
    pred = predict_iteration(p, "syncsgd", Network(3, 100e9))
    assert dict(pred.breakdown)["co-location"] > 0


def test_a_floor_above_the_composition_decides_and_says_so_one_below_is_shown_beside_it():
    """Issue 32 asked that a floor never replace the composition silently (signSGD's in-place step, 1.293 s, above
    every trial, 1.06-1.22 s, from one profile launch). From 00b75fe to seed 3 a floor decided only above the
    composition's interval; rescored on seeds 2 and 3 (pooled launches) that left the issue's PowerSGD 6-12 % short
    of its trials with its floor within 1-4 %. A floor above the composition decides, and its note says by how much
    the composition fell short, and whether that is within the two's spreads."""
    net = Network(3, 100e9)
    base = profile(colocated_ranks=3)
    composed = predict_iteration(base, "signsgd", net).iter_time_s
    d = synthetic_profile_dict()
    d["colocated_ranks"] = 3
    d["compute_spread_s"] = 0.10 * (d["forward_s"] + d["backward_s"])  # repeats that disagree by 20 %
    d["compressors"]["signsgd"]["lockstep_step_s"] = composed * 1.05
    near = predict_iteration(profile_from_dict(d), "signsgd", net)
    assert near.bound_by == "floor" and near.iter_time_s == pytest.approx(composed * 1.05, rel=3e-3)
    assert near.composed_s == pytest.approx(composed) and near.floor_s == pytest.approx(near.iter_time_s)
    assert "falls" in near.floor_note and "within the two's spreads" in near.floor_note
    assert near.low_s < near.composed_s < near.iter_time_s < near.high_s  # the interval reaches the composition
    d["compressors"]["signsgd"]["lockstep_step_s"] = composed * 1.5  # well above: the floor decides, and says why
    far = predict_iteration(profile_from_dict(d), "signsgd", net)
    assert far.bound_by == "floor" and far.iter_time_s == pytest.approx(composed * 1.5, rel=3e-3)
    assert "falls" in far.floor_note and "time-share cores" in far.floor_note
    assert far.composed_s == pytest.approx(composed)
    d["compressors"]["signsgd"]["lockstep_step_s"] = composed * 0.9  # below: shown, the composition stands
    under = predict_iteration(profile_from_dict(d), "signsgd", net)
    assert under.bound_by != "floor" and under.iter_time_s == pytest.approx(composed) and not under.floor_note
    assert under.floor_s == pytest.approx(composed * 0.9, rel=3e-3)


def test_the_link_adds_to_a_floor_so_top_k_is_not_flat():
    """Top-K in issue 32: predicted flat at its floor while the all-gather the link exposes grows at low rates."""
    d = synthetic_profile_dict()
    d["colocated_ranks"] = 3
    d["compressors"]["topk"]["lockstep_step_s"] = 2.0 * (d["forward_s"] + d["backward_s"])
    p = profile_from_dict(d)
    curve = [predict_iteration(p, "topk", Network(3, b)).iter_time_s for b in (10e9, 1e9, 100e6, 10e6)]
    assert curve == sorted(curve) and curve[-1] > curve[0] * 1.05


def test_the_interval_grows_with_the_calibrations_spread():
    p = profile()
    a = predict_iteration(p, "syncsgd", Network(2, 10e6))
    b = predict_iteration(p, "syncsgd", Network(2, 10e6), comm_rel_spread=0.2)
    assert (b.high_s - b.low_s) > (a.high_s - a.low_s)


def test_pooled_repeats_give_the_profiles_spread():
    d = synthetic_profile_dict()
    slower = {**d, "forward_s": d["forward_s"] * 1.2}
    pooled = pool_profiles([profile_from_dict(d), profile_from_dict(slower)])
    assert pooled.compute_spread_s == pytest.approx(d["forward_s"] * 0.1)
    assert pooled.relative_spread > 0


def test_a_floors_launch_to_launch_spread_widens_the_interval():
    """Seed 2 of issue 32: fp16's in-place floor on cnn bs16, 4 ranks on 2 cores, moved 66-81 ms from one profile
    launch to the next; the interval said +-0.5 ms. Pooled launches now carry the floor's half-range: the interval
    reaches the floor plus it."""
    net = Network(4, 1e15)  # the rate the floors were measured at: the link adds nothing to them
    composed = predict_iteration(profile(colocated_ranks=4), "fp16", net).iter_time_s

    def launch(step_floor_s):
        d = synthetic_profile_dict()
        d["colocated_ranks"] = 4
        d["compressors"]["fp16"]["lockstep_step_s"] = step_floor_s
        return profile_from_dict(d)

    low, mid, high = (launch(composed * k) for k in (1.3, 1.4, 1.6))
    pooled = pool_profiles([low, mid, high])
    assert pooled.compressors["fp16"].floor_spread_s == pytest.approx(composed * 0.15)
    assert pooled.compressors["syncsgd"].floor_spread_s is None  # no floor measured for it
    assert profile_from_dict(profile_to_dict(pooled)) == pooled
    one = predict_iteration(pool_profiles([mid]), "fp16", net)
    three = predict_iteration(pooled, "fp16", net)
    assert one.bound_by == three.bound_by == "floor" and one.iter_time_s == pytest.approx(three.iter_time_s)
    assert three.high_s == pytest.approx(composed * (1.4 + 0.15), rel=1e-3) and three.high_s > one.high_s
    # launches so far apart that the floor's interval reaches into the composition's: the floor, above it, still
    # decides, says it is within the spreads, and the interval reaches the floor's top
    wide = predict_iteration(pool_profiles([launch(composed * k) for k in (1.1, 1.5, 3.0)]), "fp16", net)
    assert wide.bound_by == "floor" and wide.iter_time_s == pytest.approx(composed * 1.5, rel=1e-3)
    assert "within the two's spreads" in wide.floor_note
    assert wide.high_s == pytest.approx(composed * (1.5 + 0.95), rel=1e-3)
    assert "within" not in predict_iteration(pool_profiles([launch(composed * 1.5)]), "fp16", net).floor_note
    # a floor below the composition at a rate where the link adds to it: the composition stands, and the top reaches
    # the floor's spread (the floor plus the link's addition)
    shaped = Network(4, 50e6)
    at_rate = predict_iteration(profile(colocated_ranks=4), "fp16", shaped).iter_time_s
    assert at_rate > composed * 1.01  # the link adds to the composition here
    below = pool_profiles([launch(composed * 0.6), launch(composed * 0.96)])
    pred = predict_iteration(below, "fp16", shaped)
    assert pred.bound_by != "floor" and pred.iter_time_s == pytest.approx(at_rate)
    assert pred.high_s >= composed * 0.96 + (at_rate - composed) - 1e-9
    # what-if speedups drop the floors and their spread with them
    assert with_compute_speedup(pooled, 2.0).compressors["fp16"].floor_spread_s is None


def test_at_a_free_link_the_floor_decides_below_the_composition_too():
    """Seeds 7-8 of issue 32: unshaped sync SGD composed 6.8-26.5 % above its trials (the collectives' host work charged
    to backward) while its step measured whole in place, on the same unshaped links, came within 2-7 %. Where the link
    adds nothing to the composition, that measurement is of this very step: it decides, below the composition too,
    says so, and the interval reaches up to the composition's; where the link adds to it, it stays a floor."""
    d = synthetic_profile_dict()
    d["colocated_ranks"] = 3
    free = Network(3, 1e15)
    composed = predict_iteration(profile_from_dict(d), "syncsgd", free).iter_time_s
    d["compressors"]["syncsgd"]["lockstep_step_s"] = composed * 0.9
    p = profile_from_dict(d)
    pred = predict_iteration(p, "syncsgd", free)
    assert pred.bound_by == "floor" and pred.iter_time_s == pytest.approx(composed * 0.9)
    assert pred.composed_s == pytest.approx(composed) and "the link adds nothing" in pred.floor_note
    parts = dict(pred.breakdown)
    assert parts["floor"] == pytest.approx(-composed * 0.1) and sum(parts.values()) == pytest.approx(pred.iter_time_s)
    assert pred.low_s <= pred.iter_time_s < composed <= pred.high_s
    # a rate where the link adds: the composition stands above the floor (plus the link's addition)
    slow = predict_iteration(p, "syncsgd", Network(3, 50e6))
    assert slow.bound_by != "floor" and slow.iter_time_s == pytest.approx(slow.composed_s) and not slow.floor_note
    # host-bound collectives add nothing at any rate their host cost outlasts the wire: the floor decides there too
    host_bound = Network(3, 10e9, host_s_per_wire_byte=1e-7)
    hb = predict_iteration(p, "syncsgd", host_bound)
    hb_free = predict_iteration(p, "syncsgd", Network(3, 1e15, host_s_per_wire_byte=1e-7))
    assert hb.composed_s == pytest.approx(hb_free.composed_s)
    assert hb.bound_by == "floor" and hb.iter_time_s == pytest.approx(composed * 0.9)


def test_extrapolated_rates():
    assert is_extrapolated([1e9, 10e9], 100e6) and not is_extrapolated([1e9, 10e9], 2e9)
    assert not is_extrapolated([], 100e6)
    assert not is_extrapolated([1e9, 10e9], 40e9, open_above=True) and is_extrapolated([1e9, 10e9], 40e9)
    assert is_extrapolated([1e9, 10e9], 100e6, open_above=True)


def test_crossover_verdicts_by_interval():
    assert interval_verdict(1.1, (1e8, 1e10), (2e8, 4e8)).startswith("undecided")
    assert interval_verdict(1.5, (3e8, 6e8), (2e8, 4e8)).startswith("agrees")
    assert interval_verdict(3.0, (1e9, 2e9), (2e8, 4e8)) is None  # the ratio decides: disagrees
    p = profile()
    iv = crossover_interval(p, "topk", 2, 1e6, 1e11, comm_rel_spread=0.3)
    assert iv is None or iv[0] <= iv[1]
