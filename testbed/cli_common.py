"""What every `testbed` subcommand module shares: the parser class, shared flags, the consoles, JSON output.

The command modules (cli.py, run_cli.py, model_cli.py) import this; nothing here imports them, so the CLI has no
import cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console

from shaping.plan import LinkShape, shape_from_flags
from shaping.units import is_unshaped
from testbed.cluster import registry
from testbed.errors import InputError

console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the testbed's convention: one line, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def add_name(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        default=os.environ.get("TESTBED_CLUSTER", registry.DEFAULT_CLUSTER),
        help="cluster to address (default: %(default)s, or $TESTBED_CLUSTER)",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_shape_flags(p: argparse.ArgumentParser, bw_required: bool = False) -> None:
    p.add_argument("--bw", required=bw_required, help="link rate, e.g. 100mbit, 1gbit, 9.5gbit (bits/s)")
    p.add_argument("--burst", help="token bucket size, e.g. 125kb (default: 1 ms of data at the rate, at least two frames)")
    p.add_argument("--qdisc", default="htb", help="htb (default, 64-bit rates) or tbf (up to ~34 Gbit/s)")
    p.add_argument("--delay", help="one-way delay added by netem, e.g. 5ms (needs sch_netem)")
    p.add_argument("--jitter", help="delay variation, e.g. 1ms (needs --delay)")
    p.add_argument("--loss", help="packet loss, e.g. 0.1%% (needs sch_netem)")
    p.add_argument("--force", action="store_true", help="replace a root qdisc the testbed did not create")


def bw_is_unshaped(args: argparse.Namespace) -> bool:
    """--bw none (or unshaped): the flags ask for every link unshaped, not for the current shaping."""
    return is_unshaped(getattr(args, "bw", None))


def shape_from_args(args: argparse.Namespace) -> LinkShape | None:
    """The LinkShape the flags ask for; None when no --bw is given or it is `none`. Raises InputError on bad values
    (an empty --bw included: what an unset shell variable gives is refused, never read as unshaped)."""
    bw = getattr(args, "bw", None)
    if bw_is_unshaped(args):
        args.bw = bw = None
    if bw is None:
        for flag in ("burst", "delay", "jitter", "loss"):
            if getattr(args, flag, None):
                raise InputError(f"--{flag} needs --bw: shaping starts from a rate")
        return None
    return shape_from_flags(args.bw, args.burst, args.qdisc, args.delay, args.jitter, args.loss)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def int_list(text: str, flag: str) -> list[int]:
    """`1,4` -> [1, 4]; InputError naming the flag on anything else."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,4") from None
    if not values:
        raise InputError(f"{flag}: empty; expected comma-separated integers, e.g. 1,4")
    return values
