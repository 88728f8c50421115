"""What a probe result calls within tolerance (testbed/probe.py): one bucket's head start above the rate is the
shaper doing its job; more is a link that is not shaped."""

import pytest

from shaping.plan import ideal_goodput_bps
from testbed.probe import ProbeResult


def result(rate_bps, achieved_bps, duration_s=1.0, burst_bytes=65536):
    return ProbeResult("h0", "h1", 1, duration_s, rate_bps, ideal_goodput_bps(rate_bps) if rate_bps else None,
                       achieved_bps, 0, burst_bytes=burst_bytes if rate_bps else None)  # fmt: skip


def test_one_buckets_head_start_is_within_at_a_low_rate_and_negligible_at_a_high_one():
    low = result(2_000_000, 1.113 * ideal_goodput_bps(2_000_000))  # measured: 2 Mbit/s, 1 s, 64 KB bucket
    assert low.max_ratio == pytest.approx(1.05 + 524_288 / ideal_goodput_bps(2_000_000)) and low.within(0.93)
    assert result(2_000_000, 1.076 * ideal_goodput_bps(2_000_000), duration_s=2.0).within(0.93)  # measured, 2 s
    assert not result(2_000_000, 1.5 * ideal_goodput_bps(2_000_000)).within(0.93)  # more than rate + one bucket
    high = result(100_000_000, 1.06 * ideal_goodput_bps(100_000_000))
    assert high.max_ratio == pytest.approx(1.0555, abs=1e-3) and not high.within(0.93)  # 64 KB at 100 Mbit/s: +0.5 %
    assert not result(2_000_000, 0.9 * ideal_goodput_bps(2_000_000)).within(0.93)  # short of the rate
    unshaped = result(None, 9e9)
    assert unshaped.max_ratio is None and unshaped.within(0.93)
    assert result(2_000_000, 1e6).to_dict()["max_ratio"] == pytest.approx(low.max_ratio)
