"""`testbed crossover`: up to which link rate does a compressor beat the baseline? Found by a search over the rate
(testbed/crossover_search.py, run by testbed/crossover_run.py), not a grid: parse, call, print."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from shaping.units import format_rate
from testbed.cli_common import add_json, add_name, console, print_json
from testbed.errors import InputError

DEFAULT_RANGE = "50mbit..25gbit"


def parse_range(text: str) -> tuple[int, int]:
    """`LOW..HIGH` -> (low_bps, high_bps); an empty or inverted range is refused (exit 2)."""
    from shaping.units import parse_rate_bps
    from testbed.crossover_search import check_range

    low, sep, high = str(text).partition("..")
    if not sep or not low.strip() or not high.strip():
        raise InputError(f"--bw-range {text!r}: expected LOW..HIGH, e.g. {DEFAULT_RANGE}")
    lo, hi = parse_rate_bps(low.strip(), "--bw-range"), parse_rate_bps(high.strip(), "--bw-range")
    check_range(lo, hi)
    return lo, hi


def _base_trials(args: argparse.Namespace, low_bps: int) -> list:
    """One trial per compressor at the bottom of the range, built from the trial flags as `sweep` builds them."""
    from testbed.config import parse_list
    from testbed.trial_args import sweep_trials  # the grid from the flags, as `sweep` builds it

    names = parse_list(args.compressor, "--compressor")
    if args.against in names:
        raise InputError(
            f"--compressor {args.compressor}: {args.against} is the baseline (--against {args.against}); list only the "
            "compressors to compare with it"
        )
    grid = argparse.Namespace(**{**vars(args), "config": None, "bw": format_rate(low_bps, 12),
                                 "world_size": str(args.world_size), "seeds": None})  # fmt: skip
    return sweep_trials(grid)


def cmd_crossover(args: argparse.Namespace) -> int:
    from testbed.crossover_run import find_crossovers
    from testbed.crossover_search import Settings, parse_fraction

    low, high = parse_range(args.bw_range)
    precision = parse_fraction(args.precision)
    gap = parse_fraction(args.one_run_gap, "--one-run-gap", lowest=0.0)
    settings = Settings(low, high, precision, args.repeats, one_run_gap=gap)
    trials = _base_trials(args, low)
    profiles = Path(args.profiles) if args.profiles else Path(args.out).resolve().parent / "profiles"
    say = (lambda _m: None) if args.json else (lambda m: console.print(m, markup=False, highlight=False))
    code, searches = find_crossovers(args, trials, settings, profiles, say=say)
    docs = [s.doc for s in searches]
    if args.json:
        print_json({"results": str(Path(args.out)), "searches": docs})
        return code
    console.print(_table(docs))
    for d in docs:
        if d.get("done"):
            console.print(d["verdict"], markup=False, highlight=False)
    return code


def _table(docs: list[dict[str, Any]]) -> Table:
    table = Table(title="crossover search")
    for c in ("compressor", "answer", "bracket", "trials", "run now", "model", "model / measured"):
        table.add_column(c, justify="right")
    for d in docs:
        bracket = d.get("bracket_bps") or []
        model = (format_rate(d["predicted_bps"], 3) if d.get("predicted_kind") == "crossover"
                 else (d.get("predicted_kind") or "-"))  # fmt: skip
        table.add_row(
            d["variant"],
            d.get("kind", "unfinished"),
            "..".join(format_rate(b, 3) for b in bracket) if bracket else "-",
            str(d["trials"]),
            str(d["trials_run_now"]),
            model,
            f"{d['ratio']:.2f}" if d.get("ratio") else "-",
        )
    return table


def add_commands(sub: Any) -> None:
    from testbed.trial_args import add_trial_flags, add_wait_flag

    p = sub.add_parser(
        "crossover",
        help="find the link rate where a compressor's iteration time equals the baseline's (a search, not a grid)",
        description="For each compressor: start where the model predicts the crossover, bracket it (one rate where "
        "the compressor wins, one where it loses), bisect in log-rate until the bracket is narrower than --precision "
        "or the two tie. Every trial is an ordinary results row; stored trials are reused, a rerun resumes.",
    )
    add_name(p)
    add_json(p)
    p.add_argument("--compressor", required=True, help="comma-separated compressors, e.g. powersgd,acpsgd")
    p.add_argument("--against", default="syncsgd", help="the baseline (default syncsgd)")
    p.add_argument("--world-size", type=int, default=2, help="ranks in all (default 2)")
    p.add_argument("--precision", default="10%", help="stop when the bracket is narrower than this fraction of its "
                   "rate: 10%% or 0.1 (default 10%%)")  # fmt: skip
    p.add_argument("--bw-range", default=DEFAULT_RANGE, help=f"LOW..HIGH rates searched (default {DEFAULT_RANGE})")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side at a rate where one run each does not "
                   "decide; Welch's test on them calls a tie (default 3)")  # fmt: skip
    p.add_argument("--one-run-gap", default="10%", help="one run of each side decides a rate only where their "
                   "medians are further apart than this (and one median lies beyond the other run's p5..p95); else "
                   "--repeats runs each. The default, 10%%, is how far a trial's median moved between launches on a "
                   "shared 2-core machine; 0 lets separated runs decide at any gap (a quiet cluster)")  # fmt: skip
    p.add_argument("--profiles", help="profiles and calibration for the first guess (default: profiles/ beside --out)")
    p.add_argument("--no-measure", action="store_true",
                   help="never measure a missing profile: refuse (exit 2) instead")  # fmt: skip
    add_trial_flags(p)
    add_wait_flag(p)
    p.set_defaults(func=cmd_crossover, config=None, seeds=None)
