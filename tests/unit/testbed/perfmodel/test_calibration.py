"""The calibration fit on synthetic data with known parameters, its JSON, its choice, and what the model does with it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testbed import perfmodel as pm
from testbed.errors import InputError
from testbed.model_views import calibration_summary
from testbed.report.analysis import crossover_verdict
from testbed.trial_shape import check_cross_traffic

SIZES = (16_384, 262_144, 1_048_576, 4_194_304, 16_777_216)


def synthetic_bench(
    p: int, alpha_s: float, b_ar_bps: float, b_ag_bps: float, k: float, gamma: float, *, burst_small: bool = False,
    c_lat: float = 0.0, c_byte: float = 0.0,
) -> dict:  # fmt: skip
    """What runners.collbench would write on a cluster that follows the model's equations exactly; beside compute
    (the contention probe, at the smallest and the largest size) a collective takes c_lat more per latency step and
    c_byte more per wire byte, and at the smallest size it steals far more per byte (a per-message cost)."""
    f = (p - 1) / p
    samples, contention = [], []
    for n in SIZES:
        for coll, wall, host, steps, wire in (
            ("allreduce", 2 * (p - 1) * alpha_s + 2 * f * 8 * n / b_ar_bps, f * n * (2 * k + gamma), 2 * (p - 1),
             2 * f * n),
            ("allgather", (p - 1) * alpha_s + f * 8 * n / b_ag_bps, f * n * k, p - 1, f * n),
        ):  # fmt: skip
            if burst_small and n == SIZES[0]:
                wall *= 0.5  # a shaper's burst lets the smallest message through faster than the rate
            samples.append({"collective": coll, "bytes": n, "wall_s": [wall] * 3, "cpu_s": [host / 2] * 3,
                            "algbw_bps": 8 * n / wall, "busbw_bps": 0.0})  # fmt: skip
            if n in (SIZES[0], SIZES[-1]):
                busy = wall + steps * c_lat + wire * c_byte
                stolen = host if n == SIZES[-1] else host * 50
                contention.append({"collective": coll, "bytes": n, "wall_s": [busy] * 3,
                                   "stolen_s": [stolen * 0.5, stolen, stolen * 3]})  # fmt: skip
    return {
        "schema": pm.COLLBENCH_SCHEMA,
        "backend": "gloo",
        "device": "cpu",
        "world_size": p,
        "threads": 1,
        "samples": samples,
        "contention": contention,
        "local_probe": {"bytes": 16_777_216, "reduce_s": 16_777_216 * 0.2e-9, "copy_s": 16_777_216 * 0.1e-9},
    }


def test_fit_line_recovers_a_line_and_ignores_a_fast_small_message():
    xs = [1e4, 1e5, 1e6, 1e7]
    fit = pm.fit_line(xs, [1e-4 + 2e-9 * x for x in xs])
    assert fit.intercept == pytest.approx(1e-4) and fit.slope == pytest.approx(2e-9)
    assert fit.rel_rms == pytest.approx(0.0, abs=1e-12)
    # the smallest message at half its time (a burst) moves neither the slope nor, much, the intercept
    ys = [1e-4 + 2e-9 * x for x in xs]
    ys[0] *= 0.5
    fit = pm.fit_line(xs, ys)
    assert fit.slope == pytest.approx(2e-9)
    with pytest.raises(InputError, match="two or more distinct"):
        pm.fit_line([1e6, 1e6], [1.0, 1.1])


@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_alpha_bandwidths_and_host_costs(p):
    alpha, b_ar, b_ag, k, gamma = 80e-6, 0.94e9, 0.62e9, 1.5e-9, 0.4e-9
    c = pm.calibration_from_bench(synthetic_bench(p, alpha, b_ar, b_ag, k, gamma), cluster="c", rate_bps=10**9)
    f = c.fitted
    assert f.latency_s == pytest.approx(alpha, rel=1e-6)
    assert f.bandwidth_bps == pytest.approx(b_ar, rel=1e-6)
    assert f.allgather_bandwidth_bps == pytest.approx(b_ag, rel=1e-6)
    assert f.host_s_per_wire_byte == pytest.approx(k, rel=1e-6)  # median stolen time of the repetitions
    assert f.reduce_s_per_byte == pytest.approx(gamma, rel=1e-6)
    assert f.host_source == "contention probe"
    assert c.efficiency == pytest.approx(0.94) and c.allgather_efficiency == pytest.approx(0.62)
    assert c.local_reduce_s_per_byte == pytest.approx(0.2e-9)
    # busbw follows nccl-tests: 2(p-1)/p x algbw for all-reduce, (p-1)/p for all-gather
    big = [s for s in c.samples if s.n_bytes == SIZES[-1]]
    for s in big:
        factor = 2 * (p - 1) / p if s.collective == "allreduce" else (p - 1) / p
        assert s.busbw_bps == pytest.approx(s.algbw_bps * factor)


def test_fit_without_contention_uses_cpu_time_and_burst_does_not_move_bandwidth():
    bench = synthetic_bench(2, 50e-6, 1e9, 1e9, 2e-9, 0.0, burst_small=True)
    bench.pop("contention")
    c = pm.calibration_from_bench(bench, cluster="c", rate_bps=None)
    assert c.fitted.bandwidth_bps == pytest.approx(1e9, rel=1e-6)
    assert c.fitted.host_source == "process CPU time"
    assert c.fitted.host_s_per_wire_byte == pytest.approx(1e-9, rel=1e-6)  # cpu_s is host / 2 in the fixture
    assert c.efficiency is None  # unshaped: nothing to compare the bandwidth with
    assert "efficiency" not in c.model_terms()


def test_fit_refuses_time_that_does_not_grow():
    bench = synthetic_bench(2, 50e-6, 1e9, 1e9, 1e-9, 0.0)
    for s in bench["samples"]:
        s["wall_s"] = [0.01] * 3
    with pytest.raises(InputError, match="does not grow with message size"):
        pm.calibration_from_bench(bench, cluster="c", rate_bps=None)


def test_json_round_trip_and_pick(tmp_path):
    c = pm.calibration_from_bench(
        synthetic_bench(2, 80e-6, 0.9e9, 0.9e9, 1e-9, 0.0),
        cluster="c",
        rate_bps=10**9,
        created_at="2026-01-01T00:00:00",
    )
    path = tmp_path / pm.calibration_filename("c", "gloo", 2, 10**9)
    path.write_text(json.dumps(pm.calibration_to_dict(c)))
    back = pm.load_calibration(path)
    assert back.fitted == c.fitted and back.samples == c.samples and back.contention == c.contention
    newer = pm.calibration_from_bench(
        synthetic_bench(2, 80e-6, 0.5e9, 0.5e9, 1e-9, 0.0),
        cluster="c",
        rate_bps=10**9,
        created_at="2026-02-01T00:00:00",
    )
    four = pm.calibration_from_bench(synthetic_bench(4, 80e-6, 0.5e9, 0.5e9, 1e-9, 0.0), cluster="c", rate_bps=None)
    (tmp_path / "calibration-c-gloo-p2-new.json").write_text(json.dumps(pm.calibration_to_dict(newer)))
    (tmp_path / "calibration-c-gloo-p4-unshaped.json").write_text(json.dumps(pm.calibration_to_dict(four)))
    (tmp_path / "calibration-broken.json").write_text("{")
    found = pm.find_calibrations(tmp_path)
    assert len(found) == 3  # the broken one skipped
    assert pm.pick_calibration(found, 2).created_at == "2026-02-01T00:00:00"  # same world size, newest
    assert pm.pick_calibration(found, 4).world_size == 4
    assert pm.pick_calibration(found, 2, backend="nccl") is None
    with pytest.raises(InputError, match="schema"):
        pm.calibration_from_dict({"schema": "other"})


def test_a_calibration_beside_cross_traffic_is_stored_apart_and_used_only_for_trials_with_as_many_flows(tmp_path):
    """`testbed calibrate --cross-traffic N`: its own file, its flow count kept, and a prediction of a trial without
    cross traffic never takes its (slower) terms, nor one with N flows the flat ones."""
    flat = pm.calibration_from_bench(synthetic_bench(4, 80e-6, 0.9e8, 0.9e8, 1e-9, 0.0), cluster="c", rate_bps=10**8,
                                     created_at="2026-01-01T00:00:00")  # fmt: skip
    beside = pm.calibration_from_bench(synthetic_bench(4, 5e-3, 0.4e8, 0.3e8, 1e-9, 0.0), cluster="c", rate_bps=10**8,
                                       created_at="2026-02-01T00:00:00", cross_traffic=4)  # fmt: skip
    paths = {pm.save_calibration(c, tmp_path).name for c in (flat, beside)}
    assert paths == {"calibration-c-gloo-p4-100mbit.json", "calibration-c-gloo-p4-100mbit-x4.json"}
    found = pm.find_calibrations(tmp_path)
    assert sorted(c.cross_traffic for c in found) == [0, 4]  # kept through the JSON
    assert pm.pick_calibration(found, 4).cross_traffic == 0  # the newer one is beside cross traffic: not taken
    assert pm.pick_calibration(found, 4, cross_traffic=4).cross_traffic == 4
    assert pm.pick_calibration(found, 4, cross_traffic=1) is None
    t_flat, t_beside = pm.terms_for(found, 4), pm.terms_for(found, 4, cross_traffic=4)
    slow, fast = (pm.collective_time_s("allreduce", 2**20, 1, t.network(4, 1e8), beside_compute_s=0.0)
                  for t in (t_beside, t_flat))
    assert slow > 1.5 * fast
    assert "beside 4 cross-traffic flows" in calibration_summary(beside)
    assert "cross-traffic" not in calibration_summary(flat)
    with pytest.raises(InputError, match="--cross-traffic 17: expected an integer from 0 to 16"):
        check_cross_traffic(17)


def test_model_terms_say_where_they_come_from():
    assert "defaults" in pm.model_terms(None).source
    assert pm.model_terms(None).latency_s == 50e-6 and pm.model_terms(None).efficiency == 1.0
    c = pm.calibration_from_bench(synthetic_bench(2, 80e-6, 0.9e9, 0.6e9, 1e-9, 0.0), cluster="c", rate_bps=10**9)
    t = pm.model_terms(c)
    assert t.latency_s == pytest.approx(80e-6) and t.efficiency == pytest.approx(0.9)
    assert t.allgather_efficiency == pytest.approx(0.6)
    assert "calibration" in t.source and "given on the command line" not in t.source
    t2 = pm.model_terms(c, efficiency=0.5)
    assert t2.efficiency == 0.5 and t2.allgather_efficiency is None and "efficiency given" in t2.source
    assert t2.host_s_per_wire_byte == pytest.approx(1e-9)  # the host cost still comes from the calibration


# --------------------------------------------------------------------------------------------- the model's new terms
def test_collective_never_faster_than_its_host_time():
    n = 40e6
    fast = pm.Network(2, 100e9)
    assert pm.collective_time_s("allreduce", n, 1, fast) == pytest.approx(8 * n / 100e9)
    host = pm.Network(2, 100e9, host_s_per_wire_byte=1e-9, reduce_s_per_byte=1e-9)
    assert pm.collective_host_s("allreduce", n, host) == pytest.approx(0.5 * n * 3e-9)
    assert pm.collective_time_s("allreduce", n, 1, host) == pytest.approx(0.5 * n * 3e-9)
    assert pm.collective_host_s("allgather", n, pm.Network(4, 1e9, host_s_per_wire_byte=1e-9)) == pytest.approx(
        3 * n * 1e-9
    )
    slow = pm.Network(2, 1e8, host_s_per_wire_byte=1e-9)
    assert pm.collective_time_s("allreduce", n, 1, slow) == pytest.approx(8 * n / 1e8)  # the link decides
    ag = pm.Network(2, 1e9, efficiency=1.0, allgather_efficiency=0.5)
    assert pm.collective_time_s("allgather", n, 1, ag) == pytest.approx(
        2 * pm.collective_time_s("allgather", n, 1, pm.Network(2, 1e9))
    )


def test_compute_shares_the_host_with_collectives():
    busy = [(1.0, 2.0, 0.5), (3.0, 4.0, 1.0)]
    assert pm.compute_finish_s(0.0, 0.5, busy) == pytest.approx(0.5)
    assert pm.compute_finish_s(0.0, 1.25, busy) == pytest.approx(1.5)  # half speed from 1.0
    assert pm.compute_finish_s(0.0, 2.6, busy) == pytest.approx(4.1)  # stalled from 3 to 4
    assert pm.compute_done_between(0.0, 4.1, busy) == pytest.approx(2.6)


def test_host_cost_slows_overlapped_sync_sgd_by_about_its_host_time():
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(n_buckets=4, backward_s=0.3))
    n = prof.grad_bytes
    plain = pm.predict_iteration(prof, "syncsgd", pm.Network(2, 20e9))
    k = 1e-9
    host = pm.predict_iteration(prof, "syncsgd", pm.Network(2, 20e9, host_s_per_wire_byte=k))
    host_total = 0.5 * n * 2 * k  # (p-1)/p n 2k
    assert host.iter_time_s - plain.iter_time_s == pytest.approx(host_total, rel=0.35)
    assert host.iter_time_s > plain.iter_time_s


# --------------------------------------------------------------------------------------------- crossover verdicts
@pytest.mark.parametrize(
    ("measured", "predicted", "text"),
    [
        (("crossover", 1.0e9), ("crossover", 1.04e9), "agrees within 0.75-1.33 (1.04)"),
        (("crossover", 1.57e9), ("crossover", 0.97e9), "disagrees: predicted / measured 0.62"),
        (("always", None), ("crossover", 3.5e9), "disagrees: never in the measured range"),
        (("always", None), ("crossover", 40e9), "agrees: never in the measured range (always faster)"),
        (("always", None), ("always", None), "agrees: never in the measured range"),
        (("never", None), ("never", None), "agrees: never in the measured range (always slower)"),
        (("never", None), ("always", None), "disagrees: measured always slower, model always faster"),
        (("crossover", 1e9), ("never", None), "disagrees: measured crossover, model says never"),
        (("n/a", None), ("never", None), "n/a"),
        (("crossover", 1e9), (None, None), "no prediction"),
    ],
)
def test_crossover_verdict(measured, predicted, text):
    _, verdict = crossover_verdict(*measured, *predicted, 200e6, 18e9)
    assert verdict.startswith(text)


@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_what_compute_beside_a_collective_adds(p):
    """The contention probe's wall times at two sizes against the idle line: c_lat per latency step, c_byte per wire
    byte; the host cost k comes from the largest size only (the smallest message's stolen time is per message)."""
    bench = synthetic_bench(p, 80e-6, 0.94e9, 0.62e9, 1.5e-9, 0.4e-9, c_lat=2e-3, c_byte=5e-9)
    f = pm.calibration_from_bench(bench, cluster="c", rate_bps=10**9).fitted
    assert f.contention_latency_s == pytest.approx(2e-3, rel=1e-6)
    assert f.contention_s_per_wire_byte == pytest.approx(5e-9, rel=1e-6)
    assert f.host_s_per_wire_byte == pytest.approx(1.5e-9, rel=1e-6)
    # the probe at one size only (older calibrations): no contention terms, the rest unchanged
    one = {**bench, "contention": [c for c in bench["contention"] if c["bytes"] == SIZES[-1]]}
    f1 = pm.calibration_from_bench(one, cluster="c", rate_bps=10**9).fitted
    assert (f1.contention_latency_s, f1.contention_s_per_wire_byte) == (0.0, 0.0)
    assert f1.host_s_per_wire_byte == pytest.approx(1.5e-9, rel=1e-6)


def test_contention_terms_reach_the_model_and_lengthen_collectives_beside_compute():
    bench = synthetic_bench(4, 80e-6, 0.94e9, 0.62e9, 1.5e-9, 0.4e-9, c_lat=2e-3, c_byte=5e-9)
    c = pm.calibration_from_bench(bench, cluster="c", rate_bps=10**9)
    back = pm.calibration_from_dict(json.loads(json.dumps(pm.calibration_to_dict(c))))
    assert back.fitted.contention_latency_s == pytest.approx(2e-3)
    terms = pm.model_terms(back)
    assert "+2e+03 us per step" in terms.describe() and "+5 ns/B" in terms.describe()
    net = terms.network(4, 1e9)
    plain = dataclasses.replace(net, contention_latency_s=0.0, contention_s_per_wire_byte=0.0)
    n = 8_000_000
    # all-reduce: 2(p-1) steps and 2(p-1)/p n wire bytes; all-gather of n per worker: (p-1) steps, (p-1) n bytes
    extra_ar = pm.collective_time_s("allreduce", n, 2, net) - pm.collective_time_s("allreduce", n, 2, plain)
    assert extra_ar == pytest.approx(2 * 3 * 2 * 2e-3 + 1.5 * n * 5e-9)
    extra_ag = pm.collective_time_s("allgather", n, 1, net) - pm.collective_time_s("allgather", n, 1, plain)
    assert extra_ag == pytest.approx(3 * 2e-3 + 3 * n * 5e-9)
    # beside compute for only part of its time, only that part is slowed (at free / (free + extra) of its rate)
    free, full = pm.collective_time_s("allreduce", n, 2, plain), pm.collective_time_s("allreduce", n, 2, net)
    assert pm.collective_time_s("allreduce", n, 2, net, beside_compute_s=0.0) == pytest.approx(free)
    assert pm.collective_time_s("allreduce", n, 2, net, beside_compute_s=full) == pytest.approx(full)
    half = pm.collective_time_s("allreduce", n, 2, net, beside_compute_s=full / 2)
    assert half == pytest.approx(free + (full / 2) * extra_ar / full)
    # in an iteration: a bucket ready early runs beside the rest of backward and pays; one ready at the end does not
    early = _bucket_profile(ready_at_s=0.01, backward_s=0.03)  # slowed past the end of backward: exposed
    late = _bucket_profile(ready_at_s=0.03, backward_s=0.03)
    for prof, slower in ((early, True), (late, False)):
        t_net = pm.predict_iteration(prof, "comp", net).iter_time_s
        t_plain = pm.predict_iteration(prof, "comp", plain).iter_time_s
        assert (t_net > t_plain + 1e-6) is slower, (prof.buckets, t_net, t_plain)
    # a hook that holds backward has no compute of its rank beside its collective
    blocked = pm.predict_iteration(early, "comp", net, hook_blocks_backward=True).iter_time_s
    assert blocked == pytest.approx(pm.predict_iteration(early, "comp", plain, hook_blocks_backward=True).iter_time_s)


def _bucket_profile(ready_at_s: float, backward_s: float, n: int = 8_000_000) -> pm.Profile:
    """One bucket of `n` bytes ready at `ready_at_s`; compressor "comp" sends a tenth of it, codec time 1 ms."""
    return pm.profile_from_dict({
        "schema": "testbed.profile/1", "model": "m", "batch_size": 8,
        "forward_s": 0.01, "backward_s": backward_s, "optimizer_s": 0.001,
        "buckets": [{"index": 0, "grad_bytes": n, "numel": 1, "ready_at_s": ready_at_s}],
        "compressors": {"comp": {"collective": "allreduce", "rounds": 1, "buckets": [
            {"index": 0, "payload_bytes": n // 10, "encode_s": 0.001, "decode_s": 0.001}]}},
    })  # fmt: skip


def test_lockstep_skew_is_measured_stored_and_a_floor_under_the_straggler_term():
    bench = synthetic_bench(4, 80e-6, 0.94e9, 0.62e9, 1.5e-9, 0.0)
    bench["lockstep"] = {"skew_s": [0.030, 0.010, 0.020, 0.200, 0.015]}  # one step with a long stall
    c = pm.calibration_from_bench(bench, cluster="c", rate_bps=10**9)
    assert c.skew_s == pytest.approx(0.020)  # the median step
    back = pm.calibration_from_dict(json.loads(json.dumps(pm.calibration_to_dict(c))))
    assert back.skew_s == pytest.approx(0.020)
    terms = pm.model_terms(back)
    assert terms.skew_s == pytest.approx(0.020) and "20 ms late in lockstep" in terms.describe()
    prof = _bucket_profile(ready_at_s=0.5, backward_s=0.5)
    with_skew = pm.predict_iteration(prof, "comp", terms.network(4, 1e9))
    without = pm.predict_iteration(prof, "comp", dataclasses.replace(terms.network(4, 1e9), skew_s=0.0))
    assert with_skew.straggler_s == pytest.approx(0.020)
    assert with_skew.iter_time_s == pytest.approx(without.iter_time_s + 0.020)
    # a profile spread larger than the skew keeps its own straggler term; one rank has no one to wait for
    jittery = dataclasses.replace(prof, compute_jitter_s=0.1)
    assert pm.predict_iteration(jittery, "comp", terms.network(4, 1e9)).straggler_s == pytest.approx(
        pm.straggler_s(0.1, 4))
    assert pm.predict_iteration(prof, "comp", terms.network(1, 1e9)).straggler_s == 0.0
    # a calibration stored before the probe existed: no skew
    old = pm.calibration_to_dict(c)
    old.pop("lockstep")
    assert pm.calibration_from_dict(old).skew_s == 0.0


def _at(rate_bps, k, c_byte, created_at="2026-01-01T00:00:00", b_ar=0.9e9, p=2):
    """A calibration at `rate_bps` (None: unshaped, reaching `b_ar`) with host cost k and contention c_byte."""
    bench = synthetic_bench(p, 80e-6, b_ar, b_ar * 0.6, k, 0.0, c_byte=c_byte)
    return pm.calibration_from_bench(bench, cluster="c", rate_bps=rate_bps, created_at=created_at)


def test_calibrations_at_several_rates_are_interpolated_in_log_rate():
    low = _at(10**9, k=3e-9, c_byte=2e-9, b_ar=0.9e9)
    high = _at(None, k=1e-9, c_byte=0.5e-9, b_ar=10e9)  # unshaped: sits at the 10 Gbit its all-reduce reached
    stale = _at(10**9, k=9e-9, c_byte=9e-9, created_at="2025-01-01T00:00:00", b_ar=0.9e9)
    other = _at(10**9, k=5e-9, c_byte=5e-9, p=4)
    terms = pm.terms_for([high, stale, other, low], 2)
    assert isinstance(terms, pm.TermsByRate)
    assert terms.calibrations == (low, high)  # the newest at each rate, ascending; the 4-rank one not mixed in
    assert pm.calibrated_rate_bps(high) == pytest.approx(10e9)
    # at and beyond each end: that calibration's terms; between: linear in log(rate)
    assert terms.at(0.5e9).host_s_per_wire_byte == pytest.approx(3e-9)
    assert terms.at(40e9).host_s_per_wire_byte == pytest.approx(1e-9)
    mid = terms.at(10**9 * 10**0.5)  # half-way in log between 1 and 10 Gbit
    assert mid.host_s_per_wire_byte == pytest.approx(2e-9)
    assert mid.contention_s_per_wire_byte == pytest.approx(1.25e-9)
    # the efficiency is a fraction of a shaped rate: only the shaped calibration has one, so it holds everywhere
    assert terms.at(40e9).efficiency == pytest.approx(0.9) and terms.at(40e9).allgather_efficiency == pytest.approx(0.54)
    # the model sees the interpolated terms at each bandwidth
    fn = terms.function(2, extra_latency_s=1e-3)
    net = pm.at(fn, 2, 40e9)
    assert net.bandwidth_bps == 40e9 and net.host_s_per_wire_byte == pytest.approx(1e-9)
    assert net.latency_s == pytest.approx(80e-6 + 1e-3)
    assert "interpolated by rate" in terms.describe() and "unshaped" in terms.describe()
    assert [r["rate_bps"] for r in terms.as_dict()["interpolated_by_rate"]] == pytest.approx([1e9, 10e9])
    # an unshaped calibration covers every rate above it (an unshaped trial is predicted at its probe's goodput,
    # 40 Gbit here, beyond the 10 Gbit its all-reduce reached): not extrapolated; below the lowest rate still is
    assert not terms.extrapolated(40e9) and terms.extrapolated(0.5e9) and not terms.extrapolated(3e9)
    assert not pm.model_terms(high).extrapolated(40e9) and pm.model_terms(low).extrapolated(40e9)
    shaped_only = pm.terms_for([low, _at(2 * 10**9, k=1e-9, c_byte=0.5e-9, b_ar=1.8e9)], 2)
    assert shaped_only.extrapolated(40e9)
    assert terms.as_dict()["calibrated_unshaped"] is True and shaped_only.as_dict()["calibrated_unshaped"] is False
    # given latency / efficiency override every point
    given = pm.terms_for([low, high], 2, latency_s=0.0, efficiency=0.5)
    assert given.at(40e9).latency_s == 0.0 and given.at(40e9).efficiency == 0.5
    assert "given on the command line" in given.source
    # one calibration: its terms at every rate, as before
    one = pm.terms_for([low, other], 2)
    assert isinstance(one, pm.ModelTerms) and one.host_s_per_wire_byte == pytest.approx(3e-9)
    assert pm.at(one.function(2), 2, 40e9).host_s_per_wire_byte == pytest.approx(3e-9)
    assert "defaults" in pm.terms_for([], 2).source


def test_an_unshaped_calibration_sits_above_every_shaped_one_so_unshaped_trials_take_its_terms():
    """Seed 8's configuration 4: unshaped, the all-reduce reached 4.69 Gbit, below the 5 Gbit shaped calibration. An
    unshaped trial is predicted at its goodput (beyond both): it must take the unshaped calibration's terms, not the
    5 Gbit one's; between the two, the terms are interpolated from the 5 Gbit one's to the unshaped one's."""
    shaped = _at(5 * 10**9, k=2.3e-9, c_byte=2.9e-9, b_ar=3.7e9, p=4)
    free = _at(None, k=1.6e-9, c_byte=1.6e-9, b_ar=4.69e9, p=4)
    low = _at(10**9, k=3.5e-9, c_byte=0.8e-9, b_ar=0.93e9, p=4)
    terms = pm.terms_for([free, shaped, low], 4)
    assert terms.calibrations == (low, shaped, free)  # the unshaped one last, though it reached less than 5 Gbit
    assert terms.calibrated_rates_bps == pytest.approx((1e9, 5e9, 5.5e9))  # 10 % above the highest shaped rate
    goodput = 15e9
    assert terms.at(goodput).host_s_per_wire_byte == pytest.approx(1.6e-9)  # the unshaped calibration's own terms
    assert terms.at(goodput).contention_s_per_wire_byte == pytest.approx(1.6e-9)
    assert terms.at(5e9).host_s_per_wire_byte == pytest.approx(2.3e-9)  # a 5 Gbit trial: its own calibration's
    assert 1.6e-9 < terms.at(5.2e9).host_s_per_wire_byte < 2.3e-9
    # `predict --bw none` stands where the unshaped calibration sits, so it too takes its terms
    assert terms.unshaped_rate_bps == pytest.approx(5.5e9)
    assert terms.at(terms.unshaped_rate_bps).host_s_per_wire_byte == pytest.approx(1.6e-9)
    assert [r["rate_bps"] for r in terms.as_dict()["interpolated_by_rate"]] == pytest.approx([1e9, 5e9, 5.5e9])
    assert terms.as_dict()["interpolated_by_rate"][-1]["host_s_per_wire_byte"] == pytest.approx(1.6e-9)
    # one that reached more than every shaped rate (and 10 % beyond) stays where it reached
    fast = _at(None, k=1.6e-9, c_byte=1.6e-9, b_ar=7e9, p=4)
    assert pm.terms_for([fast, shaped, low], 4).calibrated_rates_bps == pytest.approx((1e9, 5e9, 7e9))


def test_interpolated_terms_decide_a_crossover_the_host_cost_hides():
    """A compressor whose only advantage at high rates is the host cost it saves (8x fewer bytes, 50 ms of codec):
    with one calibration's high host cost it wins at every rate; with the host cost calibrated lower unshaped,
    sync SGD is faster at the top of the range and the model shows the crossover."""
    n = 40_000_000
    prof = pm.profile_from_dict({
        "schema": "testbed.profile/1", "model": "m", "batch_size": 8,
        "forward_s": 0.01, "backward_s": 0.06, "optimizer_s": 0.004,
        "buckets": [{"index": 0, "grad_bytes": n, "numel": 1, "ready_at_s": 0.06}],
        "compressors": {"comp": {"collective": "allreduce", "rounds": 1, "buckets": [
            {"index": 0, "payload_bytes": n // 8, "encode_s": 0.025, "decode_s": 0.025}]}},
    })  # fmt: skip
    low = _at(10**9, k=3e-9, c_byte=0.0)
    high = _at(None, k=0.2e-9, c_byte=0.0, b_ar=20e9)
    one = pm.crossover(prof, "comp", 2, 1e8, 4e10, terms=pm.terms_for([low], 2).function(2))
    both = pm.crossover(prof, "comp", 2, 1e8, 4e10, terms=pm.terms_for([low, high], 2).function(2))
    assert one.kind == "always"
    assert both.kind == "crossover" and 1e9 < both.bandwidth_bps < 4e10
