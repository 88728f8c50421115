"""Qdisc plans without root: default burst and quantum, validation, and the `tc` lines `--dry-run` prints."""

import pytest

from shaping.plan import (
    CLASS_HANDLE,
    MIN_BURST_FRAMES,
    NETEM_HANDLE,
    ROOT_HANDLE,
    TBF_MAX_RATE_BPS,
    LinkShape,
    default_burst_bytes,
    default_quantum_bytes,
    ideal_goodput_bps,
    render_clear,
    render_tc,
    shape_from_flags,
)
from testbed.errors import InputError

G = 10**9
M = 10**6


def test_handles_mark_the_testbed():
    assert ROOT_HANDLE == 0x7E570000
    assert CLASS_HANDLE == 0x7E570001
    assert NETEM_HANDLE >> 16 == 0x7E58


@pytest.mark.parametrize(
    ("rate_bps", "burst"),
    [
        (1 * G, 125_000),  # 1 ms at the rate
        (10 * G, 1_250_000),
        (25 * G, 3_125_000),
        (100 * G, 12_500_000),
        (400 * G, 50_000_000),
        (600 * M, 75_000),
        (524_288_000, 65_536),  # exactly 64 KiB per ms
        (500 * M, 62_500),  # 1 ms all the way down (the 64 KB floor before schema 6 is gone)
        (100 * M, 12_500),
        (24_224_000, 3_028),  # two frames are 1 ms here
        (10 * M, 3_028),  # floor: two full frames (2 x 1514 B)
        (2 * M, 3_028),
        (1_000, 3_028),
    ],
)
def test_default_burst(rate_bps, burst):
    assert default_burst_bytes(rate_bps) == burst
    assert LinkShape(rate_bps).effective_burst_bytes == burst


def test_burst_floor_is_two_frames_and_its_rule_names_the_trials_measured_with_it():
    from shaping.plan import BURST_POLICY
    from testbed.config import Trial

    assert MIN_BURST_FRAMES == 2 and default_burst_bytes(1_000, mtu=9000) == 2 * 9014
    shaped, unshaped = Trial("syncsgd", 2 * M, 2), Trial("syncsgd", None, 2)
    assert shaped.config()["burst_policy"] == BURST_POLICY == "1ms-2frames"
    assert "burst_policy" not in unshaped.config()  # unshaped trials keep their ids
    assert "burst_policy" not in Trial("syncsgd", 2 * M, 2, burst_bytes=65_536).config()  # a given bucket is its own
    assert "burst_policy" in Trial("syncsgd", None, 2, host_rates=(("h1", 2 * M),)).config()  # a straggler link


def test_explicit_burst_wins():
    assert LinkShape(10 * G, burst_bytes=15_000).effective_burst_bytes == 15_000
    assert LinkShape(10 * G, burst_bytes=15_000).to_dict()["burst_bytes"] == 15_000


@pytest.mark.parametrize(
    ("rate_bps", "quantum"),
    [
        (1_000, 1_514),  # clamped up to one full frame (MTU 1500 + Ethernet header)
        (10 * M, 1_514),  # rate/1000 = 1250 < one frame
        (100 * M, 12_500),  # rate/8/1000
        (1 * G, 125_000),
        (1_600 * M, 200_000),  # exactly the ceiling
        (10 * G, 200_000),  # clamped: the kernel warns "quantum of class is big" above this
        (100 * G, 200_000),
    ],
)
def test_default_quantum(rate_bps, quantum):
    assert default_quantum_bytes(rate_bps) == quantum
    assert LinkShape(rate_bps).quantum_bytes == quantum


def test_quantum_follows_mtu_floor():
    assert default_quantum_bytes(10 * M, mtu=9000) == 9_014


def test_ideal_goodput_is_0956_of_rate():
    assert ideal_goodput_bps(1 * G) == pytest.approx(1 * G * 1448 / 1514)
    assert ideal_goodput_bps(1 * G) / G == pytest.approx(0.956, abs=5e-4)
    assert ideal_goodput_bps(100 * M, mtu=9000) / (100 * M) == pytest.approx(8948 / 9014)


# ---------------------------------------------------------------------------------------------- validation
def test_tbf_above_32bit_limit_rejected_with_clear_error():
    assert TBF_MAX_RATE_BPS == (2**32 - 1) * 8  # about 34.36 Gbit/s
    LinkShape(TBF_MAX_RATE_BPS, qdisc="tbf")  # the limit itself is fine
    with pytest.raises(InputError) as info:
        LinkShape(40 * G, qdisc="tbf")
    message = str(info.value)
    assert "40gbit" in message and "34.36gbit" in message
    assert "32-bit" in message and "--qdisc htb" in message
    with pytest.raises(InputError):
        LinkShape(TBF_MAX_RATE_BPS + 8, qdisc="tbf")


def test_htb_takes_100g_and_beyond():
    assert LinkShape(100 * G).qdisc == "htb"
    assert LinkShape(400 * G, qdisc="htb").rate_bps == 400 * G


def test_unknown_qdisc_lists_choices():
    with pytest.raises(InputError, match="accepted htb, tbf"):
        LinkShape(G, qdisc="netem")


def test_burst_smaller_than_a_frame_rejected():
    LinkShape(G, burst_bytes=1_600)
    with pytest.raises(InputError, match="smaller than one frame"):
        LinkShape(G, burst_bytes=1_599)


def test_jitter_needs_delay():
    with pytest.raises(InputError, match="--jitter needs --delay"):
        LinkShape(G, jitter_s=0.001)


def test_needs_netem_only_for_delay_or_loss():
    assert not LinkShape(G).needs_netem
    assert LinkShape(G, delay_s=0.005).needs_netem
    assert LinkShape(G, loss_pct=0.1).needs_netem


def test_describe_and_to_dict():
    s = LinkShape(G, delay_s=0.005, jitter_s=0.001, loss_pct=0.1)
    assert s.describe() == "htb 1gbit burst 125kb delay 5ms±1ms loss 0.1%"
    assert s.to_dict() == {
        "qdisc": "htb",
        "rate_bps": G,
        "burst_bytes": 125_000,
        "quantum_bytes": 125_000,
        "delay_s": 0.005,
        "jitter_s": 0.001,
        "loss_pct": 0.1,
    }
    assert LinkShape(G, qdisc="tbf").to_dict()["quantum_bytes"] is None


# ---------------------------------------------------------------------------------------------- dry-run rendering
def test_render_htb_100g():
    lines = render_tc("eth0", LinkShape(100 * G))
    assert lines == [
        "tc qdisc replace dev eth0 root handle 7e57: htb default 1",
        "tc class replace dev eth0 parent 7e57: classid 7e57:1 htb rate 100000000000bit ceil 100000000000bit "
        "burst 12500000b cburst 12500000b quantum 200000",
    ]


def test_render_htb_in_namespace():
    lines = render_tc("h0", LinkShape(100 * M), netns="tb-x-sw")
    assert lines[0] == "tc -n tb-x-sw qdisc replace dev h0 root handle 7e57: htb default 1"
    assert lines[1] == (
        "tc -n tb-x-sw class replace dev h0 parent 7e57: classid 7e57:1 htb rate 100000000bit ceil 100000000bit "
        "burst 12500b cburst 12500b quantum 12500"
    )


def test_render_tbf():
    assert render_tc("eth0", LinkShape(20 * G, qdisc="tbf")) == [
        "tc qdisc replace dev eth0 root handle 7e57: tbf rate 20000000000bit burst 2500000b latency 50ms"
    ]


def test_render_explicit_burst():
    (_, cls) = render_tc("eth0", LinkShape(8 * G, burst_bytes=15_000))
    assert "burst 15000b cburst 15000b" in cls


@pytest.mark.parametrize(
    ("shape", "netem"),
    [
        (LinkShape(G, delay_s=0.005), "netem delay 5000us"),
        (LinkShape(G, delay_s=0.005, jitter_s=0.001), "netem delay 5000us 1000us"),
        (LinkShape(G, loss_pct=0.1), "netem loss 0.1%"),
        (LinkShape(G, delay_s=0.0005, loss_pct=2), "netem delay 500us loss 2%"),
        (LinkShape(G, qdisc="tbf", delay_s=0.01), "netem delay 10000us"),
    ],
)
def test_render_netem_below_the_rate_limiter(shape, netem):
    lines = render_tc("eth0", shape)
    assert len(lines) == (3 if shape.qdisc == "htb" else 2)
    assert lines[-1] == f"tc qdisc replace dev eth0 parent 7e57:1 handle 7e58: {netem}"


def test_no_netem_line_without_delay_or_loss():
    assert not any("netem" in line for line in render_tc("eth0", LinkShape(G)))


def test_render_clear():
    assert render_clear("eth0") == ["tc qdisc del dev eth0 root handle 7e57:"]
    assert render_clear("h3", "tb-x-sw") == ["tc -n tb-x-sw qdisc del dev h3 root handle 7e57:"]


# ------------------------------------------------------------------ one home: from_dict / matches / to_flags
def test_from_dict_round_trips_to_dict():
    for shape in (
        LinkShape(10**9),
        LinkShape(25 * 10**8, burst_bytes=500_000, qdisc="tbf"),
        LinkShape(10**8, delay_s=0.005, jitter_s=0.001, loss_pct=0.1),
    ):
        again = LinkShape.from_dict(shape.to_dict())
        assert again.to_dict() == shape.to_dict()
        assert again.describe() == shape.describe()


def test_from_dict_of_a_read_back_takes_netem_and_rounds_burst_to_default():
    shown = {"owned": True, "qdisc": "htb", "rate_bps": 10**9, "burst_bytes": 125_003, "netem": {"delay_s": 0.002}}
    shape = LinkShape.from_dict(shown, read_back=True)
    assert shape == LinkShape(10**9, delay_s=0.002)  # 3 bytes off the default burst is the default
    assert LinkShape.from_dict(shown).burst_bytes == 125_003  # a record keeps its burst exactly
    far = LinkShape.from_dict({**shown, "burst_bytes": 250_000}, read_back=True)
    assert far.burst_bytes == 250_000


def test_matches_a_read_back_within_tolerance():
    shape = LinkShape(10**9, delay_s=0.002)
    shown = {"owned": True, "qdisc": "htb", "rate_bps": 10**9, "burst_bytes": 125_100, "netem": {"delay_s": 0.002}}
    assert shape.matches(shown)
    assert not shape.matches({**shown, "owned": False})
    assert not shape.matches({**shown, "rate_bps": 10**8})
    assert not shape.matches({**shown, "burst_bytes": 200_000})
    assert not shape.matches({**shown, "netem": {}})
    assert not LinkShape(10**9, qdisc="tbf").matches(shown)
    assert not shape.matches(None)


def test_to_flags_parse_back_to_the_same_shape():
    for shape in (
        LinkShape(10**9),
        LinkShape(25 * 10**8, burst_bytes=500_000, qdisc="tbf"),
        LinkShape(10**8, delay_s=0.005, jitter_s=0.001, loss_pct=0.1),
    ):
        flags = dict(zip(shape.to_flags()[::2], shape.to_flags()[1::2], strict=True))
        again = shape_from_flags(
            flags["--bw"],
            flags.get("--burst"),
            flags["--qdisc"],
            flags.get("--delay"),
            flags.get("--jitter"),
            flags.get("--loss"),
        )
        assert again == shape
