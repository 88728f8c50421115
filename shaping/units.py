"""Units the user types, parsed by the project (never by tc or pyroute2), into SI numbers.

Rates are bits per second with tc's bit units (`kbit mbit gbit tbit`, decimal). tc reads `kbps mbps gbps` as
*bytes* per second while most people mean bits: those spellings are rejected as ambiguous, with both readings in the
message. Sizes are bytes (`kb mb` decimal, `kib mib` binary). Times accept `us ms s`.
"""

from __future__ import annotations

import math
import re

from shaping.errors import InputError

MIN_RATE_BPS = 1_000  # 1 kbit/s
MAX_RATE_BPS = 400_000_000_000  # 400 Gbit/s

_RATE_UNITS_BPS = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTE_RATE_UNITS = {"bps": 1, "kbps": 10**3, "mbps": 10**6, "gbps": 10**9, "tbps": 10**12}
_SIZE_UNITS_BYTES = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}
_TIME_UNITS_S = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z/]*)\s*$")

RATE_HELP = "a rate like 500kbit, 100mbit, 9.5gbit or 100Gbit (bits/s; plain numbers are bits/s)"


def _split(text: str, what: str, accepted: str) -> tuple[float, str]:
    if not isinstance(text, str):
        text = str(text)
    if not text.strip():  # what an unset shell variable gives (`--bw "$BW"`): never a silent default
        raise InputError(f"{what} {text!r}: empty (an unset variable?); expected {accepted}")
    m = _NUMBER_UNIT.match(text)
    if not m:
        raise InputError(f"{what} {text!r} is not a number with a unit; expected {accepted}")
    return float(m.group(1)), m.group(2).lower()


def parse_rate_bps(text: str | int | float, what: str = "rate") -> int:
    """Parse a link rate and return bits per second (int). Raises InputError naming what is accepted."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(str(text), what, RATE_HELP)
    if unit in _BYTE_RATE_UNITS:
        as_bits = value * _BYTE_RATE_UNITS[unit] * 8
        as_bytes_unit = unit.replace("bps", "bit")
        raise InputError(
            f"{what} {text}: ambiguous unit; tc reads {unit} as bytes/s ({format_rate(as_bits)}), most people mean "
            f"bits/s ({format_rate(value * _BYTE_RATE_UNITS[unit])}). Write {_fmt_num(value)}{as_bytes_unit} "
            f"or {_fmt_num(value * 8)}{as_bytes_unit}"
        )
    if unit not in _RATE_UNITS_BPS:
        raise InputError(f"{what} {text!r}: unknown unit {unit!r}; expected {RATE_HELP}")
    bps = value * _RATE_UNITS_BPS[unit]
    if not math.isfinite(bps) or bps < MIN_RATE_BPS or bps > MAX_RATE_BPS:
        raise InputError(f"{what} {text}: out of range; accepted 1kbit to 400gbit")
    return int(round(bps))


def parse_size_bytes(text: str | int, what: str = "size") -> int:
    """Parse a size (burst, buffer) into bytes. `kb`/`mb` are decimal, `kib`/`mib` binary."""
    accepted = "a size like 64kb, 1.25mb, 256kib or a plain number of bytes"
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        value, unit = _split(str(text), what, accepted)
    if unit.endswith("bit"):
        raise InputError(f"{what} {text!r}: sizes are bytes, not bits; expected {accepted}")
    if unit not in _SIZE_UNITS_BYTES:
        raise InputError(f"{what} {text!r}: unknown unit {unit!r}; expected {accepted}")
    size = int(round(value * _SIZE_UNITS_BYTES[unit]))
    if size <= 0 or size > 2**31:
        raise InputError(f"{what} {text}: out of range; accepted 1 byte to 2 GiB")
    return size


def parse_time_s(text: str | float, what: str = "time") -> float:
    """Parse a duration (delay, jitter, latency) into seconds. A plain number is milliseconds, like tc."""
    accepted = "a time like 100us, 5ms or 1s"
    if isinstance(text, int | float) and not isinstance(text, bool):
        value, unit = float(text), "ms"
    else:
        value, unit = _split(str(text), what, accepted)
        unit = unit or "ms"
    if unit not in _TIME_UNITS_S:
        raise InputError(f"{what} {text!r}: unknown unit {unit!r}; expected {accepted}")
    seconds = value * _TIME_UNITS_S[unit]
    if seconds < 0 or seconds > 60:
        raise InputError(f"{what} {text}: out of range; accepted 0 to 60s")
    return seconds


def parse_percent(text: str | float, what: str = "loss") -> float:
    """Parse a percentage such as `0.1%` or `0.1` into percent (0..100)."""
    raw = str(text).strip().rstrip("%")
    try:
        pct = float(raw)
    except ValueError:
        raise InputError(f"{what} {text!r} is not a percentage; expected e.g. 0.1% (0 to 100)") from None
    if not 0 <= pct <= 100:
        raise InputError(f"{what} {text}: out of range; accepted 0% to 100%")
    return pct


def _fmt_num(x: float) -> str:
    return f"{x:.6g}"


def format_rate(bps: float, digits: int = 4) -> str:
    """Human form of a rate in bits/s, in the units tc and users write: 9.5gbit, 100mbit, 500kbit. Rounded to
    `digits` significant digits before the unit is chosen, so 999.99e6 reads 1gbit, not 1e+03mbit. The one rate
    formatter of the project (the performance model and the report print 3 digits)."""
    bps = float(f"{bps:.{digits}g}")
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            return f"{bps / scale:.{digits}g}{unit}"
    return f"{bps:.{digits}g}bit"


UNSHAPED = "none"  # the one spelling of an unshaped link (`--bw none`); "unshaped" is read as the same
UNSHAPED_WORDS = (UNSHAPED, "unshaped")


def is_unshaped(text: object) -> bool:
    """Whether a `--bw` value (or a sweep's rate) says "no shaping": none or unshaped, any case."""
    return text is not None and str(text).strip().lower() in UNSHAPED_WORDS


def rate_or_unshaped(bps: float | None, digits: int = 4) -> str:
    """A link's rate as tables and file names say it: `format_rate`, or "unshaped" for no rate (None or 0)."""
    return format_rate(bps, digits) if bps else "unshaped"


def format_size(size_bytes: float) -> str:
    """Human form of a byte count (decimal units, as `parse_size_bytes` reads them back)."""
    for unit, scale in (("gb", 10**9), ("mb", 10**6), ("kb", 10**3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.4g}{unit}"
    return f"{int(size_bytes)}b"
