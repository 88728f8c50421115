"""Units the user types: rates in bits/s (tc's bit units), sizes in bytes, times, percentages.

The accept and reject tables are the contract: `9gbps` is never guessed, the range is 1 kbit/s to 400 Gbit/s.
"""

import re

import pytest

from shaping.units import (
    MAX_RATE_BPS,
    MIN_RATE_BPS,
    format_rate,
    format_size,
    parse_percent,
    parse_rate_bps,
    parse_size_bytes,
    parse_time_s,
)
from testbed.errors import InputError

RATES_ACCEPTED = [
    ("100mbit", 100_000_000),
    ("1gbit", 1_000_000_000),
    ("9.5gbit", 9_500_000_000),
    ("100Gbit", 100_000_000_000),
    ("100GBIT", 100_000_000_000),
    ("500kbit", 500_000),
    ("1kbit", 1_000),  # the lower bound
    ("400gbit", 400_000_000_000),  # the upper bound
    ("0.4tbit", 400_000_000_000),
    ("2500bit", 2_500),
    ("1000000", 1_000_000),  # plain numbers are bits/s
    ("1e9", 1_000_000_000),
    (" 100 mbit ", 100_000_000),
    ("1.5mbit", 1_500_000),
    (1_000_000_000, 1_000_000_000),
    (2.5e9, 2_500_000_000),
]


@pytest.mark.parametrize(("text", "bps"), RATES_ACCEPTED)
def test_rate_accepted(text, bps):
    got = parse_rate_bps(text)
    assert got == bps
    assert isinstance(got, int)


RATES_REJECTED = [
    ("0", "out of range"),
    ("0mbit", "out of range"),
    (0, "out of range"),
    (-5, "out of range"),
    ("-5mbit", "not a number"),
    ("", "empty (an unset variable?)"),
    ("   ", "empty"),
    ("garbage", "not a number"),
    ("mbit", "not a number"),
    ("fast", "not a number"),
    ("1.2.3gbit", "not a number"),
    ("10 megabit", "unknown unit"),
    ("10gb", "unknown unit"),  # bytes, not a rate
    ("10g", "unknown unit"),
    ("999bit", "out of range"),  # below 1 kbit/s
    ("999", "out of range"),
    ("400.1gbit", "out of range"),
    ("1tbit", "out of range"),
    ("1e400", "out of range"),  # overflows to inf
    ("inf", "not a number"),
    ("nan", "not a number"),
]


@pytest.mark.parametrize(("text", "why"), RATES_REJECTED)
def test_rate_rejected(text, why):
    with pytest.raises(InputError) as info:
        parse_rate_bps(text, "--bw")
    message = str(info.value)
    assert why in message
    assert message.startswith("--bw")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "bits_reading", "bytes_reading"),
    [
        ("9gbps", "9gbit", "72gbit"),
        ("100mbps", "100mbit", "800mbit"),
        ("500kbps", "500kbit", "4mbit"),
        ("1.25Gbps", "1.25gbit", "10gbit"),
        ("1000bps", "1kbit", "8kbit"),
    ],
)
def test_byte_rate_units_rejected_as_ambiguous_with_both_readings(text, bits_reading, bytes_reading):
    with pytest.raises(InputError) as info:
        parse_rate_bps(text, "--bw")
    message = str(info.value)
    assert "ambiguous" in message
    assert "bytes/s" in message and "bits/s" in message
    assert f"({bytes_reading})" in message, message  # what tc would do
    assert f"({bits_reading})" in message, message  # what most people mean
    assert "\n" not in message


def test_ambiguous_message_suggests_bit_spellings():
    message = str(pytest.raises(InputError, parse_rate_bps, "9gbps", "--bw").value)
    assert message.endswith("Write 9gbit or 72gbit")


def test_rate_range_constants():
    assert MIN_RATE_BPS == 1_000
    assert MAX_RATE_BPS == 400_000_000_000


@pytest.mark.parametrize("bps", [1_000, 500_000, 10_000_000, 100_000_000, 9_500_000_000, 100_000_000_000])
def test_format_rate_reads_back(bps):
    assert parse_rate_bps(format_rate(bps)) == bps


@pytest.mark.parametrize(
    ("bps", "text"), [(9_500_000_000, "9.5gbit"), (100_000_000, "100mbit"), (500_000, "500kbit"), (10**12, "1tbit")]
)
def test_format_rate(bps, text):
    assert format_rate(bps) == text


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64kb", 64_000),
        ("1.25mb", 1_250_000),
        ("12.5MB", 12_500_000),
        ("64kib", 65_536),
        ("1mib", 1_048_576),
        ("1500", 1_500),
        ("1500b", 1_500),
        ("15k", 15_000),
        (125_000, 125_000),
    ],
)
def test_size_accepted(text, size):
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10kbit", "bytes, not bits"),
        ("0", "out of range"),
        ("0kb", "out of range"),
        ("3gib", "out of range"),
        ("", "empty"),
        ("lots", "not a number"),
        ("10 parsecs", "unknown unit"),
    ],
)
def test_size_rejected(text, why):
    with pytest.raises(InputError, match=why):
        parse_size_bytes(text, "--burst")


@pytest.mark.parametrize("size", [1_500, 65_536, 125_000, 1_250_000, 12_500_000])
def test_format_size_reads_back(size):
    # display form (4 significant digits): reads back as the same size to within 0.1 %
    assert parse_size_bytes(format_size(size)) == pytest.approx(size, rel=1e-3)


@pytest.mark.parametrize(("size", "text"), [(125_000, "125kb"), (1_250_000, "1.25mb"), (12_500_000, "12.5mb")])
def test_format_size(size, text):
    assert format_size(size) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5ms", 0.005), ("100us", 1e-4), ("1s", 1.0), ("2sec", 2.0), ("5", 0.005), (20, 0.020), ("0ms", 0.0)],
)
def test_time_accepted(text, seconds):
    assert parse_time_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "why"), [("61s", "out of range"), ("5min", "unknown unit"), ("soon", "not a number")])
def test_time_rejected(text, why):
    with pytest.raises(InputError, match=why):
        parse_time_s(text, "--delay")


@pytest.mark.parametrize(("text", "pct"), [("0.1%", 0.1), ("0.1", 0.1), ("100%", 100.0), (0, 0.0)])
def test_percent_accepted(text, pct):
    assert parse_percent(text) == pytest.approx(pct)


@pytest.mark.parametrize(("text", "why"), [("101%", "out of range"), ("-1", "out of range"), ("much", "percentage")])
def test_percent_rejected(text, why):
    with pytest.raises(InputError, match=why):
        parse_percent(text, "--loss")


@pytest.mark.parametrize(
    ("items", "why"),
    [
        (["0"], "an unshaped link is spelled none"),
        ([""], "empty (an unset variable?)"),
        (["1gbit", " "], "empty"),
    ],
)
def test_trial_rates_refuse_empty_and_zero(items, why):
    from testbed.config import parse_rates

    with pytest.raises(InputError, match=re.escape(why)):
        parse_rates(items)


def test_trial_rates_spell_unshaped_none():
    from testbed.config import parse_list, parse_rates

    assert parse_rates(["none", "1gbit"]) == [None, 1_000_000_000]
    with pytest.raises(InputError, match=re.escape("item 2 of 2 is empty")):
        parse_list("1gbit,", "--bw")
