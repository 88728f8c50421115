"""Host-side shaping CLI: what the Ansible role and the lab backend run on each host (one code path with local mode).

    python -m shaping apply --dev IFACE --bw RATE [--burst SIZE] [--qdisc htb|tbf] [--ingress] [--netns NS]
                            [--peers CIDR,...] [--offload auto|on|off]
                            [--delay T] [--jitter T] [--loss PCT] [--force] [--force-mgmt-iface]
                            [--confirm-within SECONDS] [--dry-run] [--json]
    python -m shaping confirm  --dev IFACE [--netns NS] [--json]    keep the pending change (ends its timer)
    python -m shaping rollback --dev IFACE [--netns NS] [--json]    undo the pending change now
    python -m shaping clear    --dev IFACE [--ingress] [--netns NS] [--json]
    python -m shaping show     --dev IFACE [--netns NS] [--json]
    python -m shaping kernel-check [--json]                          which qdiscs/actions this kernel offers

`apply` is declarative: the interface ends up with exactly the requested egress shaping, plus ingress shaping (ifb)
when --ingress is given (without it a testbed ingress redirect is removed). Nothing is changed when the interface
already matches ("changed": false). With --confirm-within N the change is undone after N seconds unless `confirm`
runs (see shaping/commit_confirm.py). The interface that carries an SSH session (normally the controller's) is refused
unless --force-mgmt-iface. Errors print one line; bad input exits 2 before anything changes.

Through sudo (the root-owned helper of ansible/roles/testbed_host, which calls `main(argv, data_ifaces=...)`) every
argument is a stranger's: the device must be the host's data NIC, and --netns, --state-dir and
TESTBED_SHAPING_STATE_DIR are refused (shaping/caller.py; docs/lab-guide.md, "Threat model and the sudo rule").

This module parses, checks the caller and prints; the work is the library's: shaping/apply.py (apply, clear, show)
and shaping/kernel.py (kernel-check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from shaping import caller, classify, commit_confirm, kernel, lockout
from shaping.apply import ApplyRequest, apply, clear, show
from shaping.errors import InputError, TestbedError
from shaping.plan import LinkShape, shape_from_flags
from shaping.units import format_rate


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        raise InputError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m shaping", description="Shape a host's NIC (egress, and ingress via ifb).")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser, dev: bool = True) -> None:
        if dev:
            sp.add_argument("--dev", required=True, help="interface to shape (the data NIC)")
            sp.add_argument("--netns", help="network namespace of the interface (default: this one)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        sp.add_argument("--state-dir", help=argparse.SUPPRESS)

    a = sub.add_parser("apply", help="shape an interface")
    common(a)
    a.add_argument("--bw", required=True, help="rate, e.g. 200mbit, 9gbit (bits/s)")
    a.add_argument("--burst", help="bucket size, e.g. 1.25mb (default: 1 ms of data, at least two frames)")
    a.add_argument("--qdisc", default="htb", choices=("htb", "tbf"))
    a.add_argument("--ingress", action="store_true", help="also shape what arrives (ifb redirect)")
    a.add_argument(
        "--peers",
        help="shape only traffic to (egress) and from (ingress) these addresses/CIDRs, e.g. 10.1.0.2,10.1.0.3; "
        "everything else passes unshaped (default: shape every packet)",
    )
    a.add_argument("--delay", help="added delay, e.g. 5ms (needs netem)")
    a.add_argument("--jitter", help="delay variation, e.g. 1ms (needs netem)")
    a.add_argument("--loss", help="packet loss, e.g. 0.1%% (needs netem)")
    a.add_argument("--force", action="store_true", help="replace a root/ingress qdisc the testbed did not create")
    a.add_argument("--force-mgmt-iface", action="store_true", help="shape even the interface carrying the SSH session")
    a.add_argument(
        "--mgmt-addr", action="append", default=[], help="also protect the interface that routes to this address"
    )
    a.add_argument(
        "--offload",
        default="off",
        help="HTB hardware offload: on (refused where the NIC lacks hw-tc-offload), auto (where it has it) or off "
        "(default; software htb)",
    )
    a.add_argument("--confirm-within", type=float, help="undo unless `confirm` runs within this many seconds")
    a.add_argument("--dry-run", action="store_true", help="print the equivalent tc commands, change nothing")

    for name, text in (
        ("confirm", "keep the pending shaping change"),
        ("rollback", "undo the pending shaping change now"),
        ("show", "read back the shaping of an interface"),
    ):
        common(sub.add_parser(name, help=text))
    c = sub.add_parser("clear", help="remove the testbed's shaping (egress and ingress)")
    common(c)
    c.add_argument("--ingress", action="store_true", help="accepted for symmetry: clear always removes both")
    c.add_argument(
        "--forget",
        action="store_true",
        help="also end any commit-confirm timer of the interface and remove its state (testbed down)",
    )
    common(sub.add_parser("kernel-check", help="probe qdisc support in a throwaway namespace"), dev=False)
    return p


def _shape(args: argparse.Namespace) -> LinkShape:
    if str(args.bw).strip().lower() in ("none", "unshaped"):
        raise InputError(f"--bw {args.bw}: apply needs a rate; to remove the shaping run `python -m shaping clear`")
    return shape_from_flags(args.bw, args.burst, args.qdisc, args.delay, args.jitter, args.loss)


# ------------------------------------------------------------------------------------------------------- commands
def cmd_apply(args: argparse.Namespace) -> dict[str, Any]:
    """`apply`: the flags as an ApplyRequest (checked in the order they always were), then shaping.apply.apply."""
    lockout.check_mgmt_addresses(args.mgmt_addr)
    shape = _shape(args)
    request = ApplyRequest(
        dev=args.dev,
        shape=shape,
        netns=args.netns,
        peers=classify.parse_peers(args.peers),
        ingress=bool(args.ingress),
        force=args.force,
        force_mgmt_iface=args.force_mgmt_iface,
        mgmt_addr=tuple(args.mgmt_addr),
        offload=args.offload,
        confirm_within=args.confirm_within,
        dry_run=args.dry_run,
        state_dir=args.state_dir,
    )
    return apply(request)


def _text(cmd: str, res: dict[str, Any]) -> str:
    if cmd == "apply" and res.get("dry_run"):
        head = [f"# shaped: {res['classifier']}"] if res["peers"] else []  # without peers: the plain tc lines
        return "\n".join([*head, *res["commands"]])
    if cmd == "apply":
        what = "egress+ingress" if res["ingress"] else "egress"
        line = f"{res['dev']}: {'shaped' if res['changed'] else 'already shaped'} {what} at "
        line += f"{format_rate(res['egress']['rate_bps'])} ({res['egress']['qdisc']}), {res['classifier']}"
        if res.get("confirm"):
            line += f"; confirm within {res['confirm']['within_s']:g}s: python -m shaping confirm --dev {res['dev']}"
        return line
    if cmd == "show":
        e, i = res["egress"], res["ingress"]
        rate = format_rate(e["rate_bps"]) if e["rate_bps"] else "-"
        line = f"{res['dev']}: egress {e['qdisc'] or 'none'} {rate} ({e['ownership']})"
        if e["owned"]:
            line += f", {classify.describe(tuple(e.get('peers') or ()))}"
        if i["active"] and i["shaping"]:
            line += f"; ingress via {i['ifb']} {format_rate(i['shaping']['rate_bps'] or 0)}"
        if res["pending"]:
            line += f"; change {res['pending']['status']}"
        return line
    if cmd == "kernel-check":
        return " ".join(f"{k}={'yes' if v else 'no'}" for k, v in res["features"].items())
    return json.dumps(res)


def check_caller(args: argparse.Namespace, data_ifaces: tuple[str, ...] | None = None) -> None:
    """Where privilege begins: the device a valid name (one of `data_ifaces`, when the helper pins them), the
    namespace a plain name, and through sudo (or from a non-root caller) no namespace and no state-directory
    override. InputError (exit 2) before anything is read or changed."""
    trusted = not caller.untrusted()
    caller.check_state_dir_override(args.state_dir, trusted=trusted)
    if getattr(args, "dev", None) is not None:
        caller.check_dev(args.dev, data_ifaces)
    harmless = bool(getattr(args, "dry_run", False)) and os.geteuid() != 0  # prints tc lines, can change nothing
    caller.check_netns(getattr(args, "netns", None), trusted=trusted or harmless)


def main(argv: list[str] | None = None, *, data_ifaces: tuple[str, ...] | None = None) -> int:
    """The CLI. `data_ifaces`: the only devices accepted (the sudo helper passes the host's data NIC)."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = _parser().parse_args(argv)
        check_caller(args, data_ifaces)
        handler = {
            "apply": cmd_apply,
            "confirm": lambda a: commit_confirm.confirm(a.dev, netns=a.netns, base=a.state_dir),
            "rollback": lambda a: commit_confirm.rollback(a.dev, netns=a.netns, base=a.state_dir),
            "clear": lambda a: clear(a.dev, netns=a.netns, state_dir=a.state_dir, forget=getattr(a, "forget", False)),
            "show": lambda a: show(a.dev, netns=a.netns, state_dir=a.state_dir),
            "kernel-check": lambda a: kernel.check(),
        }[args.cmd]
        res = handler(args)
        print(json.dumps(res) if args.json else _text(args.cmd, res))
        if args.cmd == "kernel-check" and not res["ok"]:
            return 1
        return 0
    except TestbedError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - one line for the user, the traceback with --debug
        if debug:
            raise
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
