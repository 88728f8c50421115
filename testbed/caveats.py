"""What a stored trial's own figures say about its measurement: the warnings `testbed run` prints under a trial,
`sweep` prints beside it, and the report counts (a row is a dict of results columns, docs/results-format.md).

- still warming up: the first two measured steps took more than UNSTEADY_RATIO x the last two (`settle_ratio`);
- the token bucket's head start: a full bucket could have carried more than HEAD_START_SHARE of the measured steps'
  time unshaped (docs/shaping.md, the head start at low rates).
"""

from __future__ import annotations

import math
from typing import Any

from shaping.plan import default_burst_bytes
from shaping.units import format_rate, format_size


def _num(row: dict[str, Any], key: str) -> float | None:
    """A column's number, None where it is missing, null or NaN (rows loaded by pandas carry NaN)."""
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


UNSTEADY_RATIO = 1.10  # a trial whose first two measured steps took this much longer than its last two


def unsteady_note(row: dict[str, Any]) -> str | None:
    """A one-line warning when the trial's steps were still getting faster while measured (`settle_ratio`), else
    None: its mean and p50 overstate the steady step (4 ranks on 2 cores, Sign-SGD after 2 warm-up steps: 1.43x)."""
    ratio = _num(row, "settle_ratio")
    if row.get("status") != "ok" or ratio is None or ratio <= UNSTEADY_RATIO:
        return None
    return (f"warning: trial {row['trial_id']} was still warming up: its first two measured steps took "
            f"{ratio:.2f}x its last two; measure it again with a larger --warmup-iters (was {row['warmup_iters']})")


HEAD_START_SHARE = 0.05  # warn when the token bucket's head start could be this share of the measured time


def head_start_note(row: dict[str, Any]) -> str | None:
    """A one-line warning when the link's token bucket could have carried a large share of the measured steps'
    traffic unshaped, else None. A full bucket of `burst_bytes` lets a flow run ahead of the rate by
    burst x 8 / rate seconds (results schema 5's 64 KB at 2 Mbit/s: 262 ms; the default now: 12 ms); the warm-up
    drains only part of it, so a short measurement at a low rate has fast first steps and a mean that is too low
    (64 KB, PowerSGD, 2 hosts, 2 Mbit/s: 28.0-28.4 ms over 30 iterations, 30.9 ms over 200; p5 15-17 ms against 28.6). The figure is a bound: the bias measured is about a
    third of it. A straggler link (--host-bw, its bucket the default for its rate) counts when its head start is the
    longer one."""
    rate, burst, wall, iters = (_num(row, k) for k in ("rate_bps", "burst_bytes", "wall_measured_s", "iters"))
    if row.get("status") != "ok" or not wall or not iters:
        return None
    links = [(burst, rate)] if rate and burst else []
    slowest = _num(row, "min_host_rate_bps")
    if slowest and slowest != rate:
        links.append((default_burst_bytes(slowest), slowest))
    if not links:
        return None
    burst, rate = max(links, key=lambda link: link[0] / link[1])
    head_start_s = burst * 8 / rate
    share = head_start_s / wall
    if share <= HEAD_START_SHARE:
        return None
    need = math.ceil(iters * share / HEAD_START_SHARE)
    return (f"warning: trial {row['trial_id']} measured {wall:.2f} s of steps at {format_rate(rate)}, and the link's "
            f"{format_size(burst)} token bucket ({head_start_s * 1e3:.0f} ms of data at the rate) lets the first "
            f"steps pass unshaped: its mean may be up to {share * 100:.0f} % low; measure it again with --iters {need} "
            f"or more (was {int(iters)})")


CHECKS = {"still warming up": unsteady_note, "token-bucket head start above 5 %": head_start_note}


def trial_notes(row: dict[str, Any]) -> list[str]:
    """Every warning of a trial (none for a steady, long enough or failed one)."""
    return [n for n in (check(row) for check in CHECKS.values()) if n]


def report_note(rows: list[dict[str, Any]]) -> str | None:
    """One line for the report: how many of these trials carry each warning, with a few of their ids; None when
    none does."""
    parts = []
    for kind, check in CHECKS.items():
        ids = [r["trial_id"] for r in rows if check(r)]
        if ids:
            shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
            parts.append(f"{len(ids)} {kind} ({shown})")
    if not parts:
        return None
    return ("trials whose measurement warned (`testbed run`/`sweep` said how to measure them again): "
            + "; ".join(parts))
