"""Performance model: cost formulas against hand-computed cases, overlap sanity, crossover, what-if knobs."""

import json
import math
from dataclasses import replace

import pytest

from testbed.errors import InputError
from testbed.perfmodel import (
    Network,
    allgather_time_s,
    allreduce_time_s,
    crossover,
    find_crossover,
    fit_efficiency,
    load_profile,
    log_grid,
    pick_profile,
    pool_profiles,
    predict_curves,
    predict_iteration,
    profile_filename,
    profile_from_dict,
    profile_to_dict,
    straggler_s,
    summarize,
    synthetic_profile_dict,
    with_codec_speedup,
    with_compute_speedup,
)

F, BW, OPT = 0.01, 0.06, 0.004


def two_bucket_profile(grad_bytes_each=1_000_000, enc=0.0, dec=0.0, ratio=0.1, collective="allreduce", rounds=1):
    """Two buckets: bucket 0 ready half-way through backward, bucket 1 at its end."""
    return profile_from_dict(
        {
            "schema": "testbed.profile/1",
            "model": "m",
            "batch_size": 8,
            "forward_s": F,
            "backward_s": BW,
            "optimizer_s": OPT,
            "buckets": [
                {"index": 0, "grad_bytes": grad_bytes_each, "numel": 1, "ready_at_s": BW / 2},
                {"index": 1, "grad_bytes": grad_bytes_each, "numel": 1, "ready_at_s": BW},
            ],
            "compressors": {
                "comp": {
                    "collective": collective,
                    "rounds": rounds,
                    "buckets": [
                        {"index": i, "payload_bytes": int(grad_bytes_each * ratio), "encode_s": enc, "decode_s": dec}
                        for i in (0, 1)
                    ],
                }
            },
        }
    )


def one_bucket_profile(n_bytes, ratio, codec_s):
    """One bucket ready at the end of backward: no overlap at all, so crossover has a closed form."""
    return profile_from_dict(
        {
            "schema": "testbed.profile/1",
            "model": "m",
            "batch_size": 8,
            "forward_s": F,
            "backward_s": BW,
            "optimizer_s": OPT,
            "buckets": [{"index": 0, "grad_bytes": n_bytes, "numel": 1, "ready_at_s": BW}],
            "compressors": {
                "comp": {
                    "collective": "allreduce",
                    "rounds": 1,
                    "buckets": [
                        {
                            "index": 0,
                            "payload_bytes": int(n_bytes * ratio),
                            "encode_s": codec_s / 2,
                            "decode_s": codec_s / 2,
                        }
                    ],
                }
            },
        }
    )


# ------------------------------------------------------------------------------------------------ cost formulas
def test_allreduce_hand_computed():
    # 2(p-1)a + 2(p-1)/p * 8n/B = 6e-4 + 1.5 * 8e6/1e9 = 0.0006 + 0.012
    assert allreduce_time_s(1_000_000, 4, 1e9, 1e-4) == pytest.approx(0.0126)
    # efficiency halves the usable bandwidth: only the bandwidth term doubles
    assert allreduce_time_s(1_000_000, 4, 1e9, 1e-4, efficiency=0.5) == pytest.approx(0.0006 + 0.024)
    # two dependent rounds (PowerSGD) pay the latency twice on the same total payload
    assert allreduce_time_s(1_000_000, 4, 1e9, 1e-4, rounds=2) == pytest.approx(0.0012 + 0.012)


def test_allgather_hand_computed_and_grows_with_workers():
    # (p-1)a + (p-1) 8n_c/B = 3e-3 + 3 * 8e5/1e8
    assert allgather_time_s(100_000, 4, 1e8, 1e-3) == pytest.approx(0.003 + 0.024)
    # all-gather grows linearly in p; ring all-reduce saturates at 2x
    assert allgather_time_s(1000, 16, 1e9) / allgather_time_s(1000, 4, 1e9) == pytest.approx(5.0)
    assert allreduce_time_s(1000, 16, 1e9) / allreduce_time_s(1000, 4, 1e9) == pytest.approx((30 / 16) / 1.5)


def test_world_size_one_has_no_communication():
    assert allreduce_time_s(10**9, 1, 1e6, 1.0) == 0.0
    assert allgather_time_s(10**9, 1, 1e6, 1.0) == 0.0
    p = two_bucket_profile(enc=0.5, dec=0.5)
    for name in ("syncsgd", "comp"):
        pred = predict_iteration(p, name, Network(1, 1e3))
        assert pred.iter_time_s == pytest.approx(F + BW + OPT)
        assert pred.comm_s == 0.0 and pred.encode_s == 0.0


# ------------------------------------------------------------------------------------------------ overlap model
def test_overlap_first_bucket_hidden_last_exposed():
    p = two_bucket_profile()
    # p=2: each 1 MB all-reduce takes 8e6/1e9 = 8 ms; bucket 0 (ready at 30 ms) finishes at 38 ms, hidden;
    # bucket 1 ready at 60 ms finishes at 68 ms.
    pred = predict_iteration(p, "syncsgd", Network(2, 1e9))
    assert pred.iter_time_s == pytest.approx(F + 0.068 + OPT)
    assert pred.comm_s == pytest.approx(0.016)
    assert pred.exposed_s == pytest.approx(0.008)


def test_tiny_communication_is_fully_hidden_and_huge_is_a_serial_chain():
    p = two_bucket_profile()
    fast = predict_iteration(p, "syncsgd", Network(2, 1e15))
    assert fast.iter_time_s == pytest.approx(F + BW + OPT, rel=1e-6)
    slow = predict_iteration(p, "syncsgd", Network(2, 1e6))  # 8 s per bucket: link-bound chain after bucket 0
    t = 8.0
    assert slow.iter_time_s == pytest.approx(F + BW / 2 + 2 * t + OPT)


def test_blocking_hooks_add_codec_and_comm_in_series_with_backward():
    enc, dec = 0.002, 0.003
    p = two_bucket_profile(enc=enc, dec=dec, ratio=0.1)
    comm = 8 * 100_000 / 1e9  # p=2, payload 0.1 MB per bucket
    blocked = predict_iteration(p, "comp", Network(2, 1e9), hook_blocks_backward=True)
    assert blocked.iter_time_s == pytest.approx(F + BW + 2 * (enc + comm + dec) + OPT)
    overlapped = predict_iteration(p, "comp", Network(2, 1e9), hook_blocks_backward=False)
    # un-waited hooks: encode and decode stay on the compute path (bucket 0's decode lands during the rest of
    # backward and pushes it back); only the last bucket's communication is exposed
    assert overlapped.iter_time_s == pytest.approx(F + BW + 2 * enc + comm + 2 * dec + OPT)
    assert overlapped.timeline[0].done_s == pytest.approx(BW / 2 + enc + comm + dec)
    assert overlapped.iter_time_s < blocked.iter_time_s
    assert blocked.hook_blocks_backward and not overlapped.hook_blocks_backward


def test_async_compressors_never_block_and_syncsgd_derived_from_buckets():
    p = two_bucket_profile()
    assert "syncsgd" not in p.compressors
    a = predict_iteration(p, "syncsgd", Network(2, 1e9), hook_blocks_backward=True)
    b = predict_iteration(p, "syncsgd", Network(2, 1e9), hook_blocks_backward=False)
    assert a.iter_time_s == b.iter_time_s and not a.hook_blocks_backward
    q = profile_from_dict(synthetic_profile_dict())
    for name in ("fp16", "bf16", "powersgd"):  # --overlap off: every hook waits inside, fp16/bf16 too
        assert predict_iteration(q, name, Network(4, 1e9), hook_blocks_backward=True).hook_blocks_backward
        assert not predict_iteration(q, name, Network(4, 1e9)).hook_blocks_backward  # default: --overlap on


def test_two_rounds_cost_more_latency_than_one():
    one = two_bucket_profile(rounds=1)
    two = two_bucket_profile(rounds=2)
    net = Network(8, 1e10, latency_s=1e-3)
    blk = {"hook_blocks_backward": True}
    d = predict_iteration(two, "comp", net, **blk).iter_time_s - predict_iteration(one, "comp", net, **blk).iter_time_s
    assert d == pytest.approx(2 * 2 * 7 * 1e-3)  # one extra 2(p-1)alpha per bucket, two buckets, blocking
    # overlapped: bucket 0's extra latency hides behind the rest of backward, only the last bucket's shows
    d = predict_iteration(two, "comp", net).iter_time_s - predict_iteration(one, "comp", net).iter_time_s
    assert d == pytest.approx(2 * 7 * 1e-3)


def test_overlapped_decode_that_lands_after_backward_runs_after_it():
    enc, dec = 0.001, 0.004
    p = two_bucket_profile(grad_bytes_each=10_000_000, enc=enc, dec=dec, ratio=1.0)  # 80 ms per bucket at 1 Gbit
    pred = predict_iteration(p, "comp", Network(2, 1e9))
    comm = 0.08
    # bucket 0 starts at BW/2 + enc and lands after backward (+ bucket 1's encode) is through; the link is FIFO
    c0_end = BW / 2 + enc + comm
    c1_end = c0_end + comm
    assert pred.timeline[0].done_s == pytest.approx(c0_end + dec)
    assert pred.timeline[1].comm_start_s == pytest.approx(c0_end)
    assert pred.iter_time_s == pytest.approx(F + c1_end + dec + OPT)


def test_samples_per_s_is_global():
    p = two_bucket_profile()
    pred = predict_iteration(p, "syncsgd", Network(4, 1e9))
    assert pred.samples_per_s == pytest.approx(4 * 8 / pred.iter_time_s)


# ------------------------------------------------------------------------------------------------ crossover
def test_crossover_matches_closed_form():
    n, r, c = 1_000_000, 0.1, 0.01
    p = one_bucket_profile(n, r, c)
    # p=2 all-reduce takes 8n/B; equal when 8n(1-r)/B = c
    b_star = 8 * n * (1 - r) / c
    cx = crossover(p, "comp", 2, 1e6, 1e11)
    assert cx.kind == "crossover" and cx.wins_below is True
    assert cx.bandwidth_bps == pytest.approx(b_star, rel=1e-5)
    t_s = predict_iteration(p, "syncsgd", Network(2, cx.bandwidth_bps)).iter_time_s
    t_c = predict_iteration(p, "comp", Network(2, cx.bandwidth_bps)).iter_time_s
    assert t_c == pytest.approx(t_s, rel=1e-5)


def test_crossover_always_and_never():
    p = one_bucket_profile(1_000_000, 0.1, 0.01)  # B* = 720 Mbit/s
    assert crossover(p, "comp", 2, 1e6, 1e8).kind == "always"
    never = crossover(p, "comp", 2, 1e9, 1e11)
    assert never.kind == "never" and never.bandwidth_bps is None
    assert "never" in never.describe()


def test_find_crossover_non_monotone_reports_win_to_lose():
    # wins between 1e3 and 1e6 only: lose->win at 1e3, win->lose at 1e6; the reported one is the upper edge
    def diff(b):
        return -1.0 if 1e3 < b < 1e6 else 1.0

    kind, b, wins_below, crossings = find_crossover(diff, 1.0, 1e9)
    assert kind == "crossover" and wins_below
    assert b == pytest.approx(1e6, rel=1e-4)
    assert len(crossings) == 2


def test_summarize_max_speedup_and_grid():
    grid = log_grid(1e7, 1e10, 4)
    assert grid == pytest.approx([1e7, 1e8, 1e9, 1e10])
    p = profile_from_dict(synthetic_profile_dict())
    s = summarize(p, 4, grid, compressors=["powersgd", "fp16"])
    # fp16 halves the bytes: at most 2x; PowerSGD peaks at the lowest bandwidth
    assert 1.5 < s["fp16"].max_speedup <= 2.0
    assert s["powersgd"].at_bps == 1e7 and s["powersgd"].max_speedup > 10


# ------------------------------------------------------------------------------------------------ what-if knobs
def test_faster_compute_raises_crossover_and_speedup():
    p = profile_from_dict(synthetic_profile_dict(backward_s=0.1, forward_s=0.05, n_buckets=8))
    base = crossover(p, "powersgd", 4, 1e8, 1e11)
    fast = crossover(with_compute_speedup(p, 4), "powersgd", 4, 1e8, 1e11)
    assert base.kind == fast.kind == "crossover"
    assert fast.bandwidth_bps > base.bandwidth_bps
    net = Network(4, 5e9)

    def speedup(prof):
        return (
            predict_iteration(prof, "syncsgd", net).iter_time_s / predict_iteration(prof, "powersgd", net).iter_time_s
        )

    assert speedup(with_compute_speedup(p, 4)) > speedup(p)
    assert with_compute_speedup(p, 4).compute_s == pytest.approx(p.compute_s / 4)


def test_faster_codec_helps_compressors_not_syncsgd():
    p = profile_from_dict(synthetic_profile_dict())
    q = with_codec_speedup(p, 10)
    net = Network(4, 1e9)
    assert predict_iteration(q, "syncsgd", net).iter_time_s == predict_iteration(p, "syncsgd", net).iter_time_s
    assert predict_iteration(q, "powersgd", net).iter_time_s < predict_iteration(p, "powersgd", net).iter_time_s
    assert crossover(q, "topk", 4, 1e8, 1e11).bandwidth_bps > crossover(p, "topk", 4, 1e8, 1e11).bandwidth_bps


def test_more_workers_hurt_allgather_more_than_allreduce():
    p = profile_from_dict(synthetic_profile_dict())
    curves4 = predict_curves(p, 4, [1e8], compressors=["signsgd", "acpsgd"])
    curves32 = predict_curves(p, 32, [1e8], compressors=["signsgd", "acpsgd"])
    growth_ag = curves32["signsgd"][0].comm_s / curves4["signsgd"][0].comm_s
    growth_ar = curves32["acpsgd"][0].comm_s / curves4["acpsgd"][0].comm_s
    assert growth_ag == pytest.approx(31 / 3)
    assert growth_ar < 1.4


def test_another_model_with_more_bytes_crosses_higher():
    small = profile_from_dict(synthetic_profile_dict(grad_bytes=10_000_000))
    big = profile_from_dict(synthetic_profile_dict(model="big", grad_bytes=400_000_000))
    assert (
        crossover(big, "powersgd", 4, 1e7, 1e12).bandwidth_bps
        > crossover(small, "powersgd", 4, 1e7, 1e12).bandwidth_bps
    )


def test_straggler_is_the_median_of_the_slowest_rank():
    import random
    import statistics

    assert straggler_s(0.02, 1) == 0.0 and straggler_s(0.0, 8) == 0.0
    assert straggler_s(0.02, 2) == pytest.approx(0.02 * 0.5449, rel=1e-3)
    assert straggler_s(0.02, 4) == pytest.approx(0.02 * 0.9982, rel=1e-3)
    # against simulation: the median over iterations of the max over p ranks of normal compute times
    rng = random.Random(7)
    for p in (2, 8):
        maxima = [max(rng.gauss(0.0, 0.02) for _ in range(p)) for _ in range(20_000)]
        assert statistics.median(maxima) == pytest.approx(straggler_s(0.02, p), rel=0.05)


def test_jitter_lengthens_every_multi_rank_iteration_by_the_same_straggler_term():
    d = synthetic_profile_dict()
    steady = profile_from_dict(d)
    jittery = profile_from_dict({**d, "compute_jitter_s": 0.01})
    net = Network(world_size=4, bandwidth_bps=1e9)
    for name in ("syncsgd", "powersgd", "topk"):
        a, b = predict_iteration(steady, name, net), predict_iteration(jittery, name, net)
        assert b.straggler_s == pytest.approx(straggler_s(0.01, 4)) and a.straggler_s == 0.0
        assert b.iter_time_s == pytest.approx(a.iter_time_s + b.straggler_s)
    one = Network(world_size=1, bandwidth_bps=1e9)
    assert predict_iteration(jittery, "syncsgd", one).iter_time_s == pytest.approx(steady.compute_s)
    assert with_compute_speedup(jittery, 2.0).compute_jitter_s == pytest.approx(0.005)
    assert profile_from_dict({**d, "compute_jitter_s": -1.0}).compute_jitter_s == 0.0


def co_located(world: int, *, skew_s=None, floors=None, step_floors=None) -> dict:
    d = {**synthetic_profile_dict(), "colocated_ranks": world}
    if skew_s is not None:
        d["lockstep_skew_s"] = skew_s
    for name, floor in (floors or {}).items():
        d["compressors"][name]["lockstep_comm_s"] = floor
    for name, floor in (step_floors or {}).items():
        d["compressors"][name]["lockstep_step_s"] = floor
    return d


def test_the_profiles_own_lockstep_skew_replaces_the_estimate_at_its_world_size():
    net = Network(world_size=4, bandwidth_bps=1e9, skew_s=0.020)
    own = profile_from_dict(co_located(4, skew_s=0.030))
    assert predict_iteration(own, "syncsgd", net).straggler_s == pytest.approx(0.030)
    # measured directly with the model: it wins over the calibration's and over the estimate from the spread (ranks
    # in lockstep on shared cores vary by a time slice each, yet the slowest is late by less than sigma z_p)
    lower = profile_from_dict({**co_located(4, skew_s=0.005), "compute_jitter_s": 0.050})
    assert predict_iteration(lower, "syncsgd", net).straggler_s == pytest.approx(0.005)
    other = profile_from_dict(co_located(2, skew_s=0.030))  # 2 co-located ranks say nothing of 4
    assert predict_iteration(other, "syncsgd", net).straggler_s == pytest.approx(0.020)
    unmeasured = profile_from_dict({**co_located(4), "compute_jitter_s": 0.050})
    assert predict_iteration(unmeasured, "syncsgd", net).straggler_s == pytest.approx(straggler_s(0.050, 4))


def test_the_in_place_communication_is_a_floor_at_its_world_size_only():
    fast = Network(world_size=4, bandwidth_bps=100e9)
    plain = predict_iteration(profile_from_dict(co_located(4)), "topk", fast)
    floored = predict_iteration(profile_from_dict(co_located(4, floors={"topk": 0.050})), "topk", fast)
    assert plain.exposed_s < 0.050
    free = predict_iteration(profile_from_dict(co_located(4)), "topk", replace(fast, bandwidth_bps=1e15))
    link = plain.composed_s - free.composed_s  # what 100 Gbit/s adds to loopback's free link
    assert floored.iter_time_s == pytest.approx(plain.compute_s + plain.encode_s + plain.decode_s + 0.050 + link)
    assert floored.bound_by == "floor" and "falls" in floored.floor_note
    # issue 32 (Top-K flat at its floor): at a slow link the all-gather the link exposes comes on top of the floor
    slow = Network(world_size=4, bandwidth_bps=10e6)
    slow_plain = predict_iteration(profile_from_dict(co_located(4)), "topk", slow)
    slow_floored = predict_iteration(profile_from_dict(co_located(4, floors={"topk": 0.050})), "topk", slow)
    assert slow_floored.iter_time_s == pytest.approx(
        free.compute_s + free.encode_s + free.decode_s + 0.050 + slow_plain.composed_s - free.composed_s)
    assert slow_floored.iter_time_s > floored.iter_time_s + 0.5 * (slow_plain.composed_s - plain.composed_s)
    two = Network(world_size=2, bandwidth_bps=100e9)  # measured with 4 co-located ranks: not a floor for 2
    assert predict_iteration(profile_from_dict(co_located(4, floors={"topk": 0.050})), "topk", two).iter_time_s == (
        pytest.approx(predict_iteration(profile_from_dict(co_located(4)), "topk", two).iter_time_s))


def test_the_in_place_step_is_a_floor_at_its_world_size_only():
    fast = Network(world_size=4, bandwidth_bps=100e9)
    plain = predict_iteration(profile_from_dict(co_located(4)), "signsgd", fast)
    floor = plain.iter_time_s * 1.2  # the ranks took longer in place than the composition of the profile's medians
    floored = profile_from_dict(co_located(4, step_floors={"signsgd": floor}))
    assert predict_iteration(floored, "signsgd", fast).iter_time_s == pytest.approx(floor, rel=2e-3)  # + 100 Gbit/s
    slow = Network(world_size=4, bandwidth_bps=10e6)  # the floor plus what the link adds to the composition
    unfloored = predict_iteration(profile_from_dict(co_located(4)), "signsgd", slow).iter_time_s
    free = predict_iteration(profile_from_dict(co_located(4)), "signsgd", replace(fast, bandwidth_bps=1e15))
    assert predict_iteration(floored, "signsgd", slow).iter_time_s == pytest.approx(
        floor + unfloored - free.iter_time_s) and unfloored > floor
    two = Network(world_size=2, bandwidth_bps=100e9)  # measured with 4 co-located ranks: not a floor for 2
    unfloored = predict_iteration(profile_from_dict(co_located(4)), "signsgd", two).iter_time_s
    assert predict_iteration(floored, "signsgd", two).iter_time_s == pytest.approx(unfloored) and unfloored < floor
    floored_at_4 = predict_iteration(floored, "signsgd", fast)  # the composition stays visible beside the floor
    assert floored_at_4.composed_s == pytest.approx(plain.iter_time_s) and plain.composed_s == plain.iter_time_s
    # what-if hardware: this machine's measured step bounds nothing there
    for faster in (with_compute_speedup(floored, 2.0), with_codec_speedup(floored, 2.0)):
        assert predict_iteration(faster, "signsgd", fast).iter_time_s < plain.iter_time_s


def test_what_if_speedups_drop_the_in_place_communication_floor_and_scale_the_skew():
    fast = Network(world_size=4, bandwidth_bps=100e9)
    floored = profile_from_dict(co_located(4, skew_s=0.030, floors={"topk": 10.0}))  # the floor decides here
    assert predict_iteration(floored, "topk", fast).iter_time_s > 10.0
    for faster in (with_compute_speedup(floored, 2.0), with_codec_speedup(floored, 2.0)):
        assert predict_iteration(faster, "topk", fast).iter_time_s < 10.0  # this machine's wait bounds nothing there
    assert with_compute_speedup(floored, 2.0).lockstep_skew_s == pytest.approx(0.015)
    assert with_codec_speedup(floored, 2.0).lockstep_skew_s == pytest.approx(0.030)  # compute unchanged
    assert predict_iteration(with_compute_speedup(floored, 2.0), "syncsgd", fast).straggler_s == pytest.approx(0.015)


def test_lockstep_terms_survive_storing_and_pooling():
    a = profile_from_dict(co_located(2, skew_s=0.002, floors={"topk": 0.010}, step_floors={"topk": 0.5}))
    b = profile_from_dict(co_located(2, skew_s=0.004, floors={"topk": 0.030}, step_floors={"topk": 0.7}))
    c = profile_from_dict(co_located(2, skew_s=0.009, floors={"topk": 0.020}, step_floors={"topk": 0.6}))
    assert profile_from_dict(profile_to_dict(a)) == a
    pooled = pool_profiles([a, b, c])
    assert pooled.lockstep_skew_s == pytest.approx(0.004)
    assert pooled.compressors["topk"].lockstep_comm_s == pytest.approx(0.020)
    assert pooled.compressors["topk"].lockstep_step_s == pytest.approx(0.6)
    assert pool_profiles([a, profile_from_dict(co_located(2))]).lockstep_skew_s is None  # not measured in one


def test_fit_efficiency_median_ratio():
    assert fit_efficiency([1.0, 1.0, 1.0], [2.0, 4.0, 2.5]) == pytest.approx(0.4)
    assert fit_efficiency([1.0], [0.5]) == 1.0  # clamped
    with pytest.raises(InputError, match="cannot fit efficiency"):
        fit_efficiency([1.0], [0.0])


# ------------------------------------------------------------------------------------------------ inputs
def test_profile_roundtrip_and_pick(tmp_path):
    d = synthetic_profile_dict(model="resnet18", batch_size=32)
    path = tmp_path / "resnet18-bs32-cpu.json"
    path.write_text(json.dumps(d))
    p = load_profile(path)
    assert profile_to_dict(p) == json.loads(json.dumps(d))
    q = profile_from_dict(synthetic_profile_dict(model="resnet18", batch_size=128))
    assert pick_profile([q, p], "resnet18", 16) is p
    assert pick_profile([q, p], "vgg16", 16) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="testbed.profile/9"), "expected 'testbed.profile/1'"),
        (lambda d: d.pop("forward_s"), "missing key 'forward_s'"),
        (lambda d: d["compressors"]["topk"].update(collective="broadcast"), "expected one of allreduce, allgather"),
        (lambda d: d["compressors"]["fp16"]["buckets"].pop(), r"no entry for bucket\(s\) \[1\]"),
        (lambda d: d.update(buckets=[]), "'buckets' is empty"),
    ],
)
def test_bad_profiles_raise_input_error(mutate, message):
    d = synthetic_profile_dict()
    mutate(d)
    with pytest.raises(InputError, match=message):
        profile_from_dict(d)


def test_bad_files_and_networks(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_profile(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(InputError, match="efficiency"):
        Network(2, 1e9, efficiency=1.5)
    with pytest.raises(InputError, match="world size"):
        Network(0, 1e9)
    with pytest.raises(InputError, match="positive finite"):
        Network(2, 0)
    with pytest.raises(InputError, match="not in the profile"):
        predict_iteration(two_bucket_profile(), "powersgd", Network(2, 1e9))
    assert math.isinf(predict_iteration(two_bucket_profile(), "syncsgd", Network(2, 1e9)).iter_time_s) is False


def test_pick_profile_prefers_the_trials_colocation_then_a_solo_one():
    solo = profile_from_dict(synthetic_profile_dict(model="resnet18", batch_size=32))
    duo = profile_from_dict({**synthetic_profile_dict(model="resnet18", batch_size=32), "colocated_ranks": 2})
    quad = profile_from_dict({**synthetic_profile_dict(model="resnet18", batch_size=32), "colocated_ranks": 4})
    assert pick_profile([solo, duo, quad], "resnet18", 32, 2) is duo
    assert pick_profile([quad, solo], "resnet18", 32, 2) is solo  # no 2-rank profile: the solo one, not the 4-rank
    assert pick_profile([quad, solo], "resnet18", 32, 4) is quad
    assert pick_profile([quad], "resnet18", 32, 2) is quad
    assert profile_filename("resnet18", 32, "cpu", 4) == "resnet18-bs32-cpu-colocated4.json"
    assert profile_filename("resnet18", 32, "cpu") == "resnet18-bs32-cpu.json"
    assert profile_to_dict(duo)["colocated_ranks"] == 2


def test_pool_profiles_takes_the_median_of_every_timing():
    runs = [
        profile_from_dict(synthetic_profile_dict(model="resnet18", forward_s=f, backward_s=b, compute_jitter_s=j))
        for f, b, j in ((0.030, 0.060, 0.004), (0.050, 0.090, 0.001), (0.031, 0.066, 0.009))
    ]
    slow_codec = profile_to_dict(runs[1])
    slow_codec["compressors"]["topk"]["buckets"][0]["encode_s"] = 9.0  # one disturbed measurement
    runs[1] = profile_from_dict(slow_codec)
    pooled = pool_profiles(runs)
    assert (pooled.forward_s, pooled.backward_s, pooled.compute_jitter_s) == (0.031, 0.066, 0.004)
    assert [b.ready_at_s for b in pooled.buckets] == [0.033, 0.066]  # each bucket's median ready time
    assert pooled.compressors["topk"].buckets[0].encode_s == runs[0].compressors["topk"].buckets[0].encode_s
    assert pool_profiles(runs[:1]) == runs[0]
    other = profile_from_dict(synthetic_profile_dict(model="resnet18", batch_size=64))
    with pytest.raises(InputError, match="expected repeated measurements of one setting"):
        pool_profiles([runs[0], other])
    with pytest.raises(InputError, match="no profile given"):
        pool_profiles([])
