"""Cluster shapes without root (issue 36): the model's bottleneck, the trial's per-host shapes and ids, racks,
cross-traffic pairs, netem plans."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import testbed.perfmodel as pm
from shaping.plan import render_tc
from testbed import cross_traffic, launch_plan, trial_shape
from testbed.cluster import topology
from testbed.cluster.base import Host
from testbed.config import Trial
from testbed.errors import InputError

M = 10**6


# ------------------------------------------------------------------------------------------------ the model
def test_ring_bottleneck_is_the_straggler_link():
    b = pm.ring_bottleneck(pm.Layout((100 * M, 100 * M, 10 * M, 100 * M)))
    assert b.rate_bps == 10 * M
    assert b.link.startswith("h2 link")


def test_flat_ring_names_a_host_link_and_unshaped_is_unbounded():
    assert pm.ring_bottleneck(pm.Layout((50 * M,) * 4)).rate_bps == 50 * M
    b = pm.ring_bottleneck(pm.Layout((None,) * 4))
    assert not b.bounded and math.isinf(b.rate_bps)


def test_a_shaped_trial_from_the_flat_trials_adds_only_what_the_slow_collective_takes_beyond_their_wire_time():
    # flat: 1.0 s per iteration, 0.4 s of it on the wire (the collective alone: 0.1 s, the rest waiting for cores)
    assert pm.from_flat_trials_s(1.0, 0.4, coll_bottleneck_s=0.3, coll_flat_s=0.1) == pytest.approx(1.0)  # hidden
    assert pm.from_flat_trials_s(1.0, 0.4, coll_bottleneck_s=1.5, coll_flat_s=0.1) == pytest.approx(2.1)
    # rows without a wire time (sync SGD's built-in all-reduce): the change of the collective
    assert pm.from_flat_trials_s(1.0, None, coll_bottleneck_s=0.3, coll_flat_s=0.1) == pytest.approx(1.2)
    assert pm.from_flat_trials_s(1.0, math.nan, coll_bottleneck_s=0.3, coll_flat_s=0.1) == pytest.approx(1.2)


@pytest.mark.parametrize(("ratio", "expected_mbit", "spine"), [(1, 100, False), (2, 100, False), (4, 50, True)])
def test_spine_share_per_cross_rack_step(ratio, expected_mbit, spine):
    # 2 racks of 2 hosts at 100 Mbit/s: oversubscription = 200 / uplink; the ring crosses each uplink once per
    # direction per step, so the spine bounds it only when the uplink is below a host's rate
    uplink = 2 * 100 * M / ratio
    b = pm.ring_bottleneck(pm.Layout((100 * M,) * 4, rack_of=(0, 0, 1, 1), uplink_bps=uplink))
    assert b.rate_bps == pytest.approx(expected_mbit * M)
    assert ("spine" in b.link) is spine


def test_interleaved_racks_share_the_uplink_between_ring_steps():
    # racks 0,1,0,1: every edge crosses the spine, two per uplink direction per step
    b = pm.ring_bottleneck(pm.Layout((100 * M,) * 4, rack_of=(0, 1, 0, 1), uplink_bps=100 * M))
    assert b.rate_bps == pytest.approx(50 * M)
    assert "2 ring steps" in b.link


def test_cross_traffic_leaves_a_fair_share():
    lay = trial_shape.layout(["h0", "h1", "h2", "h3"], 100 * M, {}, cross_pairs=cross_traffic.pairs(4, 1))
    b = pm.ring_bottleneck(lay)
    assert b.rate_bps == pytest.approx(50 * M)
    assert "cross-traffic" in b.link
    four = pm.ring_bottleneck(trial_shape.layout(["h0", "h1"], 100 * M, {}, cross_pairs=cross_traffic.pairs(2, 4)))
    assert four.rate_bps == pytest.approx(100 * M / 5)


def test_cross_traffic_over_the_spine_is_counted_there():
    lay = trial_shape.layout(
        ["h0", "h1", "h2", "h3"], 100 * M, {}, rack_of=[0, 0, 1, 1], uplink_bps=100 * M,
        cross_pairs=cross_traffic.pairs(4, 2),
    )  # fmt: skip
    assert lay.spine_cross_flows == (2, 2)
    b = pm.ring_bottleneck(lay)
    assert b.rate_bps == pytest.approx(100 * M / 3)
    assert "spine" in b.link


def test_a_rows_layout_is_the_trials_rates_racks_and_flows():
    # a straggler row: h2 at 10 Mbit/s, the others at the trial's 100; the ring steps at h2's pace
    row = {"host_count": 4, "rate_bps": 100 * M, "host_rates": f'{{"h2": {10 * M}}}', "racks": 1,
           "uplink_bps": None, "cross_traffic": 0}  # fmt: skip
    lay = trial_shape.row_layout(row)
    assert lay.host_rates_bps == (100 * M, 100 * M, 10 * M, 100 * M)
    assert pm.ring_bottleneck(lay).link.startswith("h2 link")
    # racks of consecutive hosts behind a 1:4 spine, as `up --racks 2 --uplink 50mbit` builds them; nulls of a
    # frame (NaN) read as absent
    rack_row = {"host_count": 4, "rate_bps": 100 * M, "host_rates": float("nan"), "racks": 2, "uplink_bps": 50 * M,
                "cross_traffic": float("nan")}  # fmt: skip
    lay = trial_shape.row_layout(rack_row)
    assert lay.rack_of == (0, 0, 1, 1) and lay.uplink_bps == 50 * M and lay.cross_flows == (0,) * 4
    b = pm.ring_bottleneck(lay)
    assert b.rate_bps == 50 * M and b.link.startswith("spine uplink of rack 0")
    # cross traffic where the launcher starts it: flow k from host k mod n to the host half the ring away
    lay = trial_shape.row_layout({**row, "host_rates": None, "cross_traffic": 4})
    assert lay.cross_flows == (2, 2, 2, 2) and pm.ring_bottleneck(lay).rate_bps == pytest.approx(100 * M / 3)
    # an unshaped trial: nothing bounds the ring
    assert not pm.ring_bottleneck(trial_shape.row_layout({**row, "rate_bps": 0, "host_rates": None})).bounded


def test_loaded_rtt_is_the_median_of_pings_after_the_queue_builds():
    out = "\n".join(f"64 bytes from 10.0.0.2: icmp_seq={i + 1} ttl=64 time={t} ms"
                     for i, t in enumerate((0.08, 5.1, 12.0, 30.2, 28.9, 31.5, 29.0)))  # fmt: skip
    assert cross_traffic.rtt_from_ping(out) == pytest.approx(0.0296)  # median of the last four
    assert cross_traffic.rtt_from_ping("64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.091 ms") == pytest.approx(
        0.091e-3)  # fewer replies than the skip: all of them  # fmt: skip
    assert cross_traffic.rtt_from_ping("ping: connect: Network is unreachable") is None


def test_layout_refuses_bad_input():
    with pytest.raises(InputError):
        pm.Layout(())
    with pytest.raises(InputError):
        pm.Layout((0,))
    with pytest.raises(InputError):
        pm.Layout((1 * M, 1 * M), rack_of=(0,))
    with pytest.raises(InputError):
        pm.Layout((1 * M, 1 * M), cross_flows=(-1, 0))


# ------------------------------------------------------------------------------------------------ the trial
def test_trial_ids_do_not_change_without_a_shape():
    t = Trial("syncsgd", 100 * M, 4)
    assert not set(trial_shape.SHAPE_DEFAULTS) & set(t.config())
    assert Trial("syncsgd", 100 * M, 4, host_rates=(("h2", 10 * M),)).trial_id != t.trial_id
    assert Trial("syncsgd", 100 * M, 4, cross_traffic=1).trial_id != t.trial_id
    assert Trial("syncsgd", 100 * M, 4, host_rates=(("h2", 10 * M),)).config()["host_rates"] == {"h2": 10 * M}


def test_a_trial_on_racks_is_not_the_flat_trial():
    # the racks are the cluster's: resolve sets them on the trial, and the id changes with them (a sweep into a store
    # holding the flat trials must run the rack trials, not find them "already stored")
    hosts = [Host(f"h{i}", f"10.77.0.{i + 1}", "eth0", f"tb-x-h{i}") for i in range(4)]
    flat = launch_plan.resolve(Trial("syncsgd", 100 * M, 4), hosts, racks=(1, None))
    on_racks = launch_plan.resolve(Trial("syncsgd", 100 * M, 4), hosts, racks=(2, 50 * M))
    assert flat.trial_id == launch_plan.resolve(Trial("syncsgd", 100 * M, 4), hosts).trial_id  # flat ids unchanged
    assert (on_racks.racks, on_racks.uplink_bps) == (2, 50 * M) and on_racks.trial_id != flat.trial_id
    spine = launch_plan.resolve(Trial("syncsgd", 100 * M, 4), hosts, racks=(2, 100 * M))
    assert spine.trial_id not in (flat.trial_id, on_racks.trial_id)
    assert launch_plan.resolve(on_racks, hosts).trial_id == on_racks.trial_id  # resolving again keeps them
    assert "2 racks (uplink 50mbit)" in on_racks.label()

    class OnRacks:  # what resolve_on reads of a cluster: its hosts and its record's racks
        record = {"racks": topology.racks_record("x", 4, 2, 50 * M)}

        def hosts(self):
            return hosts

    assert [t.trial_id for t in launch_plan.resolve_on(OnRacks(), [Trial("syncsgd", 100 * M, 4)])] == [
        on_racks.trial_id]  # fmt: skip
    for kw in ({"racks": 0}, {"racks": 1, "uplink_bps": 10 * M}, {"racks": 2, "uplink_bps": 0}):
        with pytest.raises(InputError):
            Trial("syncsgd", 100 * M, 4, **kw)


def test_parse_host_bw():
    assert trial_shape.parse_host_bw(["h2=1gbit", "h0=none"]) == (("h0", None), ("h2", 10**9))
    assert trial_shape.parse_host_bw(["h1=10mbit,h3=20mbit"]) == (("h1", 10 * M), ("h3", 20 * M))
    for bad in (["h2"], ["h2=0"], ["=1gbit"], ["h2=1gbit", "h2=2gbit"], ["h2=9gbps"], ["h/2=1gbit"]):
        with pytest.raises(InputError):
            trial_shape.parse_host_bw(bad)


@pytest.mark.parametrize(
    "kw", [{"cross_traffic": -1}, {"cross_traffic": 17}, {"loss_pct": 101.0}, {"jitter_s": -1.0}]
)
def test_trial_refuses_bad_shape(kw):
    with pytest.raises(InputError):
        Trial("syncsgd", 100 * M, 2, **kw)


def test_unshaped_trial_refuses_netem():
    with pytest.raises(InputError):
        Trial("syncsgd", None, 2, loss_pct=1.0)


def test_host_shape_and_label():
    t = Trial("syncsgd", 100 * M, 4, host_rates=(("h2", 10 * M),), cross_traffic=2, burst_bytes=200_000)
    assert trial_shape.host_shape(t, "h2").rate_bps == 10 * M
    assert trial_shape.host_shape(t, "h2").burst_bytes is None  # --burst was sized for --bw
    assert trial_shape.host_shape(t, "h0").burst_bytes == 200_000
    assert "h2@10mbit" in t.label().replace(" ", "").lower() or "h2@" in t.label()
    assert "2 cross flows" in t.label()
    unshaped = Trial("syncsgd", None, 4, host_rates=(("h1", 10 * M),))
    assert trial_shape.host_shape(unshaped, "h0") is None
    assert trial_shape.host_shape(unshaped, "h1").rate_bps == 10 * M


def test_stragglers_expand_the_grid():
    grid = [Trial("syncsgd", 100 * M, 4), Trial("powersgd", 100 * M, 4)]
    args = SimpleNamespace(straggler_bw="50mbit,10mbit,none", straggler_host=None)
    out = trial_shape.stragglers_from_args(args, grid)
    assert len(out) == 6
    assert {dict(t.host_rates).get("h1") for t in out} == {50 * M, 10 * M, None}
    assert trial_shape.stragglers_from_args(SimpleNamespace(straggler_bw=None, straggler_host=None), grid) == grid
    with pytest.raises(InputError):
        trial_shape.stragglers_from_args(SimpleNamespace(straggler_bw=None, straggler_host="h2"), grid)
    with pytest.raises(InputError):
        trial_shape.stragglers_from_args(SimpleNamespace(straggler_bw="10mbit,", straggler_host=None), grid)


def test_unknown_host_is_refused_before_anything():
    hosts = [SimpleNamespace(name=f"h{i}") for i in range(2)]
    with pytest.raises(InputError, match="no such host"):
        trial_shape.check_hosts(Trial("syncsgd", 100 * M, 2, host_rates=(("h7", M),)), hosts)


def test_netem_refused_with_one_line_and_plans_still_render():
    t = Trial("syncsgd", 100 * M, 2, delay_s=0.005, jitter_s=0.001, loss_pct=0.5)
    with pytest.raises(InputError) as e:
        trial_shape.check_netem(t, lambda: False)
    assert "sch_netem" in str(e.value) and "\n" not in str(e.value)
    trial_shape.check_netem(t, lambda: True)
    trial_shape.check_netem(Trial("syncsgd", 100 * M, 2), lambda: False)  # nothing asked, nothing refused
    lines = "\n".join(render_tc("eth0", trial_shape.host_shape(t, "h0"), netns="tb-x-h0"))
    assert "netem" in lines and "delay 5" in lines and "loss 0.5" in lines


# ------------------------------------------------------------------------------------------------ racks, flows
def test_racks_checks():
    assert topology.check_racks(4, 2, 50 * M) == 2
    assert topology.check_racks(4, None, None) == 1
    for n, r, u in ((4, 3, None), (4, 0, None), (4, 2, 0), (4, 1, 10 * M)):
        with pytest.raises(InputError):
            topology.check_racks(n, r, u)


def test_rack_record_and_oversubscription():
    rec = {"racks": topology.racks_record("x", 4, 2, 50 * M)}
    assert rec["racks"]["members"] == [["h0", "h1"], ["h2", "h3"]]
    assert rec["racks"]["namespaces"] == ["tb-x-r0", "tb-x-r1"]
    assert topology.oversubscription(rec, 100 * M) == pytest.approx(4.0)
    assert "4:1" in topology.describe(rec, 100 * M)
    assert topology.oversubscription(rec, None) is None
    assert topology.racks_record("x", 4, 1, None) is None
    # per-host rates (a trial's row: a straggler in the first rack): the worst rack's sum over the uplink
    from testbed.cluster.base import oversubscription

    members = rec["racks"]["members"]
    rates = {"h0": 10 * M, "h1": 100 * M, "h2": 100 * M, "h3": 100 * M}
    assert oversubscription(members, rates, 50 * M) == pytest.approx(4.0)  # h2 + h3; h0 + h1 is only 110
    assert oversubscription(members, {**rates, "h3": 300 * M}, 50 * M) == pytest.approx(8.0)
    assert oversubscription(members, {**rates, "h3": None}, 50 * M) is None  # an unshaped host: undefined
    assert oversubscription(members, rates, None) is None


def test_cross_traffic_pairs_cross_the_ring():
    assert cross_traffic.pairs(4, 4) == [(0, 2), (1, 3), (2, 0), (3, 1)]
    assert cross_traffic.pairs(2, 1) == [(0, 1)]
    assert cross_traffic.pairs(1, 3) == []
