"""`testbed compressors` (built-ins and plugins with what they declare) and `testbed check-compressor SPEC`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from runners import catalog
from testbed.cli_common import add_json, console, print_json
from testbed.errors import InputError
from testbed.trial_args import add_plugin_flags, parse_opts


# ---------------------------------------------------------------------------------------------- compressors
def cmd_compressors(args: argparse.Namespace) -> int:
    from testbed import plugins

    rows: list[dict[str, Any]] = []
    for c in catalog.COMPRESSORS.values():
        rows.append({"name": c.name, "kind": "built-in", "spec": c.name, "summary": c.summary,
                     "collective": c.collective, "rounds": c.rounds, "overlaps": c.overlaps,
                     "options": {o.name: o.default for o in c.options}})  # fmt: skip
    for name, spec in sorted(plugins.entry_points().items()):
        row: dict[str, Any] = {"name": name, "kind": "plugin", "spec": spec}
        try:
            info = plugins.inspect(spec, {}, None)
        except InputError as e:
            row["error"] = str(e)
        else:
            attrs = info["attributes"]
            row.update(summary=info.get("summary"), collective=attrs.get("COLLECTIVE"), rounds=attrs.get("ROUNDS"),
                       overlaps=attrs.get("OVERLAPS"), lossless=attrs.get("LOSSLESS"), options=info.get("options"),
                       version=info.get("version"), sha256=info.get("sha256"), assumed=info.get("assumed"))  # fmt: skip
        rows.append(row)
    if args.json:
        print_json(rows)
        return 0
    t = Table(title="compressors (a plugin outside these: --compressor MODULE:FACTORY --plugin-path DIR)")
    for col in ("name", "kind", "collective", "rounds", "overlaps", "options", "summary"):
        t.add_column(col)
    for r in rows:
        opts = r.get("options") or {}
        t.add_row(r["name"] + ("" if r["kind"] == "built-in" else f" ({r['spec']})"), r["kind"],
                  str(r.get("collective") or "?"), str(r.get("rounds") or "?"),
                  "?" if r.get("overlaps") is None else ("yes" if r["overlaps"] else "no"),
                  ", ".join(f"{k}={v}" for k, v in opts.items()) or "-",
                  r.get("error") or r.get("summary") or "")  # fmt: skip
    console.print(t)
    return 0


# ---------------------------------------------------------------------------------------------- check-compressor
def cmd_check_compressor(args: argparse.Namespace) -> int:
    from testbed import conformance, plugins

    spec = plugins.resolve_name(args.spec)
    options = parse_opts(args.opt)
    plugin_path = plugins.check_plugin_path(args.plugin_path)
    if args.convergence:
        from testbed.convergence_check import check_args

        check_args(args.target_accuracy, args.max_steps)  # before anything starts
    outcome = conformance.check_compressor(spec, options, plugin_path=plugin_path, world_size=args.world_size,
                                           steps=args.steps, timeout_s=args.timeout)  # fmt: skip
    if args.convergence:  # issue 33: steps to a target accuracy on Fashion-MNIST against sync SGD's
        from testbed.convergence_check import check_convergence

        line = check_convergence(spec, options, plugin_path, world_size=args.world_size, target=args.target_accuracy,
                                 max_steps=args.max_steps)  # fmt: skip
        outcome = conformance.Outcome(outcome.spec, (*outcome.checks, line), outcome.plugin)
    if args.json:
        print_json(outcome.to_json())
    else:
        for check in outcome.checks:
            print(check.line(), flush=True)
        n_fail = sum(c.status == "fail" for c in outcome.checks)
        print(f"{spec}: {'all checks passed' if outcome.ok else f'{n_fail} check(s) failed'}")
    return 0 if outcome.ok else 1


def add_commands(sub) -> None:
    p = sub.add_parser("compressors", help="built-in compressors and installed plugins, with what they declare")
    add_json(p)
    p.set_defaults(func=cmd_compressors)

    p = sub.add_parser(
        "check-compressor",
        help="conformance checks of a compressor hook on real gloo ranks (order, replicas, payload, ...)",
        description="Run a compressor on real gloo ranks on this machine (loopback), >= 20 DDP buckets, per-rank "
        "random delays; one line per check; exit 0 only if every check passes, 1 if one fails, 2 for bad input.",
    )
    p.add_argument("spec", metavar="SPEC", help="a built-in name, an installed plugin's name, or MODULE:FACTORY "
                   "(code: it runs with this command's privileges, as root under sudo)")  # fmt: skip
    add_plugin_flags(p)
    p.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--steps", type=int, default=4, help="steps after the compressor's warm-up (default 4)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds before unfinished ranks count as a hang (default 120)")  # fmt: skip
    from testbed.convergence_check import MAX_STEPS, TARGET

    p.add_argument("--convergence", action="store_true",
                   help="also train the small CNN on Fashion-MNIST (loopback) with the compressor and with sync SGD, "
                   "same seed, and compare the steps to --target-accuracy (fails beyond 1.5x sync SGD's steps or "
                   "when never reached)")  # fmt: skip
    p.add_argument("--target-accuracy", type=float, default=TARGET, metavar="A",
                   help=f"the convergence check's target test accuracy (default {TARGET:g})")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS, metavar="N",
                   help=f"the convergence check's budget in steps (default {MAX_STEPS})")
    add_json(p)
    p.set_defaults(func=cmd_check_compressor)
