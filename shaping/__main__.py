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
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
from typing import Any

from shaping import caller, classify, commit_confirm, highrate, ingress, lockout, tc
from shaping.errors import InputError, ShapingError, TestbedError
from shaping.plan import LinkShape, render_tc, shape_from_flags
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
    a.add_argument("--burst", help="bucket size, e.g. 1.25mb (default: 1 ms of data, at least 64 KB)")
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
def _render_ingress(dev: str, shape: LinkShape, netns: str | None, peers: classify.Peers = ()) -> list[str]:
    ip = f"ip -n {netns}" if netns else "ip"
    t = f"tc -n {netns}" if netns else "tc"
    ifb = ingress.ifb_name(dev)
    queues = _nic_queues(dev, netns)
    leaf = highrate.leaf_limit_bytes(shape.rate_bps, shape.effective_burst_bytes)
    leaf_line = [] if shape.needs_netem or shape.qdisc != "htb" else [
        f"{t} qdisc replace dev {ifb} parent 7e57:1 handle 7e59: bfifo limit {leaf}"
    ]  # fmt: skip
    return [
        f"{ip} link add {ifb} type ifb" + (f" numtxqueues {queues} numrxqueues {queues}" if queues else ""),
        f"{ip} link set {ifb} alias {ingress.IFB_ALIAS_PREFIX}{dev} up",
        f"{t} qdisc add dev {dev} handle ffff: ingress",
        *classify.render_ingress_filters(t, dev, ifb, peers),
        *render_tc(ifb, shape, netns),
        *leaf_line,
    ]


def _nic_queues(dev: str, netns: str | None) -> int | None:
    """The NIC's TX queue count for --dry-run (None when it cannot be read: no such device here, no permission)."""
    path = f"/sys/class/net/{dev}/queues"
    if netns:
        return None
    try:
        return max(1, sum(1 for q in os.listdir(path) if q.startswith("tx-")))
    except OSError:
        return None


def cmd_apply(args: argparse.Namespace) -> dict[str, Any]:
    lockout.check_mgmt_addresses(args.mgmt_addr)
    shape = _shape(args)
    peers = classify.parse_peers(args.peers)
    classify.check(shape.qdisc, peers)
    dev = args.dev
    if args.confirm_within is not None:
        commit_confirm.check_within(args.confirm_within)
    mode = highrate.check_mode(args.offload)
    offload = mode != "off" and highrate.resolve_offload(mode, highrate.nic_offload_state(dev, args.netns), dev)
    if offload and args.ingress and mode == "auto":  # auto: offload where it can; with an ifb redirect it cannot
        print(f"note: --offload auto with --ingress on {dev}: software htb (an ingress redirect excludes offload)",
              file=sys.stderr)  # fmt: skip
        offload = False
    if offload and args.ingress:
        raise InputError(
            "--offload with --ingress: the offload classifier (clsact) and the ingress redirect share the NIC's "
            "ingress hook, and an ifb cannot be offloaded; shape egress only on every host (each peer flow leaves "
            "a shaped NIC)"
        )
    if offload:
        highrate.render_offload(dev, shape, peers, args.netns)  # refuses tbf and netem before anything changes
    warnings = highrate.warnings_for(shape, offload=offload, ingress=bool(args.ingress))
    for line in warnings:
        print(line, file=sys.stderr)
    if args.dry_run:
        if offload:
            return {"dev": dev, "dry_run": True, "commands": highrate.render_offload(dev, shape, peers, args.netns),
                    "plan": shape.to_dict(), "peers": list(peers), "classifier": classify.describe(peers),
                    "offload": True, "warnings": warnings}  # fmt: skip
        lines = render_tc(dev, shape, args.netns, peers)
        lines += _render_ingress(dev, shape, args.netns, peers) if args.ingress else []
        return {"dev": dev, "dry_run": True, "commands": lines, "plan": shape.to_dict(), "peers": list(peers),
                "classifier": classify.describe(peers)}  # fmt: skip
    lockout.check_lockout(dev, netns=args.netns, force_mgmt_iface=args.force_mgmt_iface, mgmt_addresses=args.mgmt_addr)
    previous = commit_confirm.snapshot(dev, netns=args.netns)  # also: InputError if dev is missing
    want_ingress = bool(args.ingress)
    same = (
        shape.matches(previous["egress"])
        and tuple(previous["egress"].get("peers") or ()) == peers
        and (
            (
                previous["ingress"]["active"]
                and shape.matches(previous["ingress"]["shaping"])
                and tuple(previous["ingress"].get("peers") or ()) == peers
            )
            if want_ingress
            else not previous["ingress"]["active"]
        )
    )
    result: dict[str, Any] = {
        "dev": dev,
        "netns": args.netns,
        "changed": not same,
        "egress": shape.to_dict(),
        "ingress": shape.to_dict() if want_ingress else None,
        "peers": list(peers),
        "classifier": classify.describe(peers),
        "offload": offload,
        "warnings": warnings,
        "confirm": None,
    }
    if same and not offload:
        return result
    try:
        if offload:
            result["egress"] = _apply_offload(dev, shape, peers, args)
        else:
            result["egress"] = tc.apply(dev, shape, netns=args.netns, force=args.force, peers=peers)
        if want_ingress:
            result["ingress"] = ingress.apply(dev, shape, netns=args.netns, force=args.force, peers=peers)
        else:
            ingress.clear(dev, netns=args.netns)
    except TestbedError as e:
        try:
            commit_confirm.restore(dev, previous, netns=args.netns)
        except TestbedError as again:
            raise ShapingError(f"{e}; restoring the previous shaping of {dev} failed too: {again}") from None
        raise
    if args.confirm_within is not None:
        result["confirm"] = commit_confirm.arm(
            dev, previous, result, args.confirm_within, netns=args.netns, base=args.state_dir
        )
    return result


def _apply_offload(dev: str, shape: LinkShape, peers: classify.Peers, args: argparse.Namespace) -> dict[str, Any]:
    """HTB offload through the host's own ethtool and tc (pyroute2 0.9 cannot set TCA_HTB_OFFLOAD): the rendered
    lines, run in order; a failing line raises (the caller restores the previous shaping), then read back."""
    import shlex

    shown = tc.show(dev, netns=args.netns)
    if shown["ownership"] == "foreign" and not args.force:
        raise tc.ForeignQdiscError(f"{dev} has a root qdisc the testbed did not create ({shown['qdisc']}); pass --force")
    for line in highrate.render_offload(dev, shape, peers, args.netns):
        done = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            tc.clear_offload_classifier(dev, netns=args.netns)
            raise ShapingError(f"HTB offload on {dev}: `{line}` failed: {done.stderr.strip() or done.returncode}")
    return {**tc.show(dev, netns=args.netns), "offload": True}


def cmd_clear(args: argparse.Namespace) -> dict[str, Any]:
    commit_confirm.check_device(args.dev, args.netns)  # before any state is touched
    cancelled = commit_confirm.cancel(args.dev, netns=args.netns, base=args.state_dir)
    egress = tc.clear(args.dev, netns=args.netns)
    egress = tc.clear_offload_classifier(args.dev, netns=args.netns) or egress
    ing = ingress.clear(args.dev, netns=args.netns)
    out = {"dev": args.dev, "netns": args.netns, "changed": bool(egress or ing), "cancelled_pending": cancelled}
    if getattr(args, "forget", False):
        out["forgotten"] = commit_confirm.forget(args.dev, netns=args.netns, base=args.state_dir)
    return out


def cmd_show(args: argparse.Namespace) -> dict[str, Any]:
    record = commit_confirm.pending(args.dev, netns=args.netns, base=args.state_dir)
    return {
        "dev": args.dev,
        "netns": args.netns,
        "egress": tc.show(args.dev, netns=args.netns),
        "ingress": ingress.show(args.dev, netns=args.netns),
        "pending": None
        if record is None
        else {k: record.get(k) for k in ("status", "deadline_unix", "timer_pid", "finished_unix", "error")},
    }


def _kernel_probe() -> dict[str, bool]:
    """Runs inside a fresh, private network namespace: try each piece on a veth pair."""
    from pyroute2 import IPRoute, protocols

    from shaping import ingress as _ingress  # noqa: F401 - registers the bfifo kind with pyroute2

    results: dict[str, bool] = {}
    with IPRoute() as ipr:
        ipr.link("add", ifname="kc0", kind="veth", peer="kc1")
        idx = ipr.link_lookup(ifname="kc0")[0]
        for kind, kw in (("htb", {"default": 1}), ("tbf", {"rate": 1e6, "burst": 65536, "latency": 50000})):
            try:
                ipr.tc("add", kind, idx, 0x7E570000, **kw)
                ipr.tc("del", index=idx, handle=0x7E570000, parent=0xFFFFFFFF)
                results[kind] = True
            except Exception:  # noqa: BLE001
                results[kind] = False
        try:
            ipr.tc("add", "htb", idx, 0x7E570000, default=1)
            ipr.tc("add", "netem", idx, 0x7E580000, parent=0x7E570000, delay=1000)
            results["netem"] = True
        except Exception:  # noqa: BLE001
            results["netem"] = False
        for leaf, kw in (("bfifo", {"limit": 100_000}), ("fq_codel", {})):  # the ifb leaf; fq_codel: the other choice
            with contextlib.suppress(Exception):  # what the netem check left
                ipr.tc("del", index=idx, handle=0x7E570000, parent=0xFFFFFFFF)
            try:
                ipr.tc("add", "htb", idx, 0x7E570000, default=1)
                ipr.tc("add-class", "htb", idx, 0x7E570001, parent=0x7E570000, rate=1e6, ceil=1e6, burst=65536,
                       cburst=65536, quantum=1514)  # fmt: skip
                ipr.tc("add", leaf, idx, 0x7E590000, parent=0x7E570001, **kw)
                results[leaf] = any(q.get_attr("TCA_KIND") == leaf for q in ipr.get_qdiscs(index=idx))
            except Exception:  # noqa: BLE001
                results[leaf] = False
            with contextlib.suppress(Exception):
                ipr.tc("del", index=idx, handle=0x7E570000, parent=0xFFFFFFFF)
        try:
            ipr.link("add", ifname="kcifb", kind="ifb")
            results["ifb"] = True
        except Exception:  # noqa: BLE001
            results["ifb"] = False
        try:
            ipr.tc("add", "ingress", idx, 0xFFFF0000)
            results["ingress"] = True
            target = ipr.link_lookup(ifname="kcifb" if results["ifb"] else "kc1")[0]
            ipr.tc(
                "add-filter",
                "u32",
                idx,
                parent=0xFFFF0000,
                prio=1,
                protocol=protocols.ETH_P_ALL,
                target=1,
                keys=["0x0/0x0+0"],
                action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": target},
            )
            results["u32_mirred"] = True
        except Exception:  # noqa: BLE001
            results.setdefault("ingress", False)
            results["u32_mirred"] = False
    return results


def cmd_kernel_check(args: argparse.Namespace) -> dict[str, Any]:
    def enter_private_netns() -> None:
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")

    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); import json, shaping.__main__ as m; "
    code += "print(json.dumps(m._kernel_probe()))"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, str(commit_confirm.PROJECT_ROOT)],  # -I: nothing of cwd or PYTHONPATH
        capture_output=True,
        text=True,
        preexec_fn=enter_private_netns,  # noqa: PLW1509 - single-threaded CLI
        cwd="/",
        timeout=60,
    )
    if proc.returncode != 0:
        raise ShapingError(f"kernel-check failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    features = json.loads(proc.stdout)
    required = ("htb", "tbf", "ifb", "ingress", "u32_mirred")
    return {"features": features, "ok": all(features[k] for k in required), "required": list(required)}


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
            "clear": cmd_clear,
            "show": cmd_show,
            "kernel-check": cmd_kernel_check,
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
