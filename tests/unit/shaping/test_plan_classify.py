"""The peers classifier as data: parsing, u32 keys (both ways), and the tc lines --dry-run prints."""

from __future__ import annotations

import struct

import pytest

from shaping import classify
from shaping.errors import InputError
from shaping.plan import LinkShape, render_tc


def test_parse_peers_normalises_sorts_and_dedupes():
    got = classify.parse_peers("10.0.0.3, 10.0.0.2/32,fd00::1/64,10.0.1.7/24,10.0.0.3")
    assert got == ("10.0.0.2/32", "10.0.0.3/32", "10.0.1.0/24", "fd00::/64")
    assert classify.parse_peers(["10.0.0.2"]) == ("10.0.0.2/32",)
    assert classify.parse_peers(None) == ()


@pytest.mark.parametrize(
    ("text", "why"), [("", "empty item"), ("10.0.0.1,", "empty item"), ("10.0.0.256", "not an address"), ("x", "not")]
)
def test_parse_peers_refuses(text, why):
    with pytest.raises(InputError, match=why):
        classify.parse_peers(text)


@pytest.mark.parametrize("cidr", ["10.1.2.3/32", "10.1.0.0/16", "0.0.0.0/0", "fd00:1::/64", "fd00::5/128", "::/0"])
@pytest.mark.parametrize("field", ["src", "dst"])
def test_u32_keys_round_trip(cidr, field):
    version = classify.version_of(cidr)
    assert classify.cidr_from_keys(classify.u32_keys(cidr, field), version, field) == cidr


def test_u32_keys_match_what_tc_writes():
    # `tc filter ... u32 match ip dst 10.1.0.0/16` shows `match 0a010000/ffff0000 at 16`
    assert classify.u32_keys("10.1.0.0/16", "dst") == [(0x0A010000, 0xFFFF0000, 16)]
    assert classify.pyroute2_keys("10.1.2.3/32", "src") == ["0x0a010203/0xffffffff+12"]
    assert classify.u32_keys("fd00::/16", "dst") == [(0xFD000000, 0xFFFF0000, 24)]


def test_decode_raw_u32_sel():
    head = struct.pack("=BBBxHHhhI", 1, 0, 2, 0, 0, 0, 0, 0)
    keys = struct.pack("!II", 0xFFFFFFFF, 0x0A000002) + struct.pack("=ii", 16, 0)
    keys += struct.pack("!II", 0xFFFF0000, 0x0A010000) + struct.pack("=ii", 12, 0)
    assert classify.decode_u32_sel(head + keys) == [(0x0A000002, 0xFFFFFFFF, 16), (0x0A010000, 0xFFFF0000, 12)]


def test_no_peers_renders_exactly_the_match_all_plan():
    lines = render_tc("eth0", LinkShape(10**9))
    assert lines[0].endswith("htb default 1") and len(lines) == 2 and "filter" not in " ".join(lines)


def test_peers_render_a_default_unshaped_class_and_filters():
    lines = render_tc("eth0", LinkShape(10**9), peers=("10.0.0.2/32", "fd00::/64"))
    assert lines[0] == "tc qdisc replace dev eth0 root handle 7e57: htb default 2"
    assert any("classid 7e57:2 htb rate 400000000000bit" in line for line in lines)
    assert "tc filter add dev eth0 parent 7e57: protocol ip prio 1 u32 match ip dst 10.0.0.2/32 flowid 7e57:1" in lines
    assert "tc filter add dev eth0 parent 7e57: protocol ipv6 prio 2 u32 match ip6 dst fd00::/64 flowid 7e57:1" in lines
    ing = classify.render_ingress_filters("tc", "eth0", "ifb-eth0", ("10.0.0.2/32",))
    assert ing == [
        "tc filter add dev eth0 parent ffff: protocol ip prio 32343 u32 match ip src 10.0.0.2/32 "
        "action mirred egress redirect dev ifb-eth0"
    ]


def test_peers_need_htb():
    with pytest.raises(InputError, match="classless"):
        render_tc("eth0", LinkShape(10**9, qdisc="tbf"), peers=("10.0.0.2/32",))
