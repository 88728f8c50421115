"""The `testbed` command.

Every error is one line on stderr: bad input exits 2 before anything changes, a failure while working exits 1 after
rolling back. `--debug` shows the traceback. Read commands take `--json`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys

from rich.table import Table

from shaping.plan import LinkShape, render_clear, render_tc
from shaping.units import format_rate, format_size, rate_or_unshaped
from testbed import crossover_cli, model_cli, plugin_cli, run_cli
from testbed.cli_common import (
    ArgumentParser,
    add_json,
    add_name,
    add_shape_flags,
    bw_is_unshaped,
    console,
    err_console,
    int_list,
    print_json,
    shape_from_args,
)
from testbed.cluster import backends, registry
from testbed.errors import ClusterError, InputError, ProbeError, TestbedError
from testbed.trial_args import add_wait_flag

__all__ = ["ArgumentParser", "add_json", "add_name", "build_parser", "console", "main", "print_json"]


# ---------------------------------------------------------------------------------------------- cluster commands
def _refuse_with_slurm(args: argparse.Namespace) -> None:
    """Flags of the other backends that mean nothing under --slurm (the allocation decides the hosts)."""
    given = [
        flag
        for flag, value in (
            ("--hosts", args.hosts),
            ("--subnet", args.subnet),
            ("--recreate", args.recreate),
            ("--gpus", args.gpus),
            ("--verify", args.verify),
            ("--tolerance", args.tolerance),
            ("--accept-new-host-keys", args.accept_new_host_keys),
            ("--no-provision", args.no_provision),
        )
        if value not in (None, False)
    ]
    if given:
        raise InputError(
            f"--slurm takes its hosts from the allocation: {', '.join(given)} do not apply (use --iface, --inventory, "
            "--name, --bw and --allow-cpu)"
        )


def _tolerance(args: argparse.Namespace) -> float:
    """--tolerance: achieved / ideal goodput below which a probe flags the link (probe, and up/shape --verify, where it
    needs --verify: it says how close the verifying probe must come)."""
    from testbed.probe import DEFAULT_TOLERANCE

    if args.tolerance is None:
        return DEFAULT_TOLERANCE
    if not 0 < args.tolerance < 1:
        raise InputError(
            f"--tolerance {args.tolerance:g}: expected a fraction in (0, 1) of the ideal goodput, e.g. {DEFAULT_TOLERANCE}"
        )
    if getattr(args, "verify", True) is False:
        raise InputError("--tolerance says how close --verify's probe must come: it needs --verify")
    return args.tolerance


def _add_tolerance_flag(p: argparse.ArgumentParser, what: str) -> None:
    from testbed.probe import DEFAULT_TOLERANCE  # the default's one home (a few ms of imports, once a parser)

    p.add_argument("--tolerance", type=float, metavar="FRACTION",
                   help=f"{what} when achieved / ideal goodput is below this (default {DEFAULT_TOLERANCE}; a busy "
                   "machine may need less)")  # fmt: skip


def cmd_up(args: argparse.Namespace) -> int:
    shape = shape_from_args(args)
    tolerance = _tolerance(args)
    if (args.racks is not None or args.uplink is not None) and (args.slurm or args.inventory):
        raise InputError("--racks/--uplink build emulated racks; lab and Slurm hosts keep their real switches")
    if args.slurm:
        from testbed.cluster.slurm import SlurmCluster

        _refuse_with_slurm(args)
        _, status = SlurmCluster.up(
            registry.check_name(args.name), iface=args.iface, inventory=args.inventory, shape=shape,
            allow_cpu=args.allow_cpu,
        )  # fmt: skip
        if args.json:
            print_json({"created": True, **status})
        else:
            _print_lab_hosts(status, shape, f"slurm cluster {status['name']} (job {status['slurm_job']})")
        return 0
    if args.iface:
        raise InputError("--iface names the data NIC of Slurm nodes: it needs --slurm (lab hosts: testbed_data_iface)")
    if args.inventory:
        from testbed.cluster.lab import LabCluster

        _, status = LabCluster.up(
            registry.check_name(args.name),
            args.inventory,
            shape=shape,
            accept_new_host_keys=args.accept_new_host_keys,
            allow_cpu=args.allow_cpu,
            run_playbook=not args.no_provision,
        )
        verified = _verify_up(args.name, shape, tolerance, created=True) if args.verify else None
        if args.json:
            print_json({"created": True, **status, "probe": verified})
        else:
            _print_lab_hosts(status, shape)
        return 0
    from testbed.cluster.local import DEFAULT_SUBNET, LocalCluster
    from testbed.cluster_lease import hold
    from testbed.gpus import parse_gpus_flag

    registry.check_name(args.name)
    # --recreate removes the cluster first: never under a command that holds it (refused, naming the holder)
    with hold(args.name) if args.recreate else contextlib.nullcontext():
        cluster, created = LocalCluster.up(
            args.name,
            4 if args.hosts is None else args.hosts,
            shape=shape,
            subnet=args.subnet or DEFAULT_SUBNET,
            recreate=args.recreate,
            force=args.force,
            gpus=parse_gpus_flag(args.gpus),
            racks=args.racks,
            uplink_bps=_uplink_bps(args.uplink),
        )
    verified = _verify_up(cluster.name, shape, tolerance, created) if args.verify else None
    if args.json:
        print_json({"created": created, **cluster.status(), "probe": verified})
        return 0
    what = "up" if created else "already up (same parameters)"
    console.print(
        f"cluster [bold]{cluster.name}[/]: {len(cluster.hosts())} hosts {what}, "
        f"{shape.describe() if shape else 'unshaped'} on every link"
    )
    _print_hosts(cluster.status())
    return 0


def _uplink_bps(text: str | None) -> int | None:
    """--uplink RATE (0 and none refused: a spine is a rate; leave --uplink out for an unshaped spine)."""
    if text is None:
        return None
    from shaping.units import parse_rate_bps

    if str(text).strip().lower() in ("0", "0bit", "none", "unshaped", ""):
        raise InputError(f"--uplink {text!r}: expected a rate > 0, e.g. 4gbit (leave --uplink out: an unshaped spine)")
    return parse_rate_bps(text, "--uplink")


def _print_lab_hosts(status: dict, shape: LinkShape | None, title: str | None = None) -> None:
    hosts = status["hosts"]
    what = shape.describe() if shape else "unshaped"
    sys.stdout.write(f"{title or 'lab cluster ' + status['name']}: {len(hosts)} hosts up, {what} on every data NIC\n")
    for h in hosts:
        sys.stdout.write(
            f"  {h['name']:<12} {h['address']:<16} {h['data_iface']:<12} gpus {h.get('gpus', '?')}  "
            f"nic {h.get('nic_speed_mbps') or '?'} Mbit/s  python {h.get('python', '?')}  torch {h.get('torch', '?')}  "
            f"cuda {h.get('cuda') or '-'}  nccl {h.get('nccl') or '-'}  driver {h.get('driver') or '-'}"
            f"{'  ' + h['gpu_name'] if h.get('gpu_name') else ''}\n"
        )


def _verify_up(name: str, shape: LinkShape | None, tolerance: float, created: bool) -> list[dict]:
    """`up --verify`, emulated or lab hosts, under the cluster's lease (no trial beside the probe). A cluster this
    command made and could not verify is removed again (a failure halfway leaves nothing); one that was up before,
    with the same parameters, is left as it was."""
    from testbed.cluster_lease import hold

    with hold(name, restore_shaping=False):
        try:
            return _verify(backends.open_cluster(name), shape, tolerance)
        except ProbeError as e:
            if not created:
                raise
            backends.down(name)
            raise ProbeError(f"{e}; the cluster this command made is removed again") from e


def _verify(cluster, shape: LinkShape | None, tolerance: float) -> list[dict]:
    from testbed.probe import probe_pair

    hosts = cluster.hosts()
    if len(hosts) < 2:
        return []
    result = probe_pair(cluster, hosts[0], hosts[1], requested_bps=shape.rate_bps if shape else None,
                        burst_bytes=shape.effective_burst_bytes if shape else None, duration_s=1.0)  # fmt: skip
    if not result.within(tolerance):
        raise ProbeError(
            f"verification failed: {hosts[0].name}->{hosts[1].name} achieved {format_rate(result.achieved_bps)} "
            f"vs ideal {format_rate(result.ideal_goodput_bps)} ({result.ratio:.2f}); shaping is not doing what was asked"
        )
    console.print(
        f"verified: {hosts[0].name}->{hosts[1].name} {format_rate(result.achieved_bps)} "
        f"({result.ratio:.3f} of ideal goodput)"
        if result.ratio
        else "verified (unshaped)"
    )
    return [result.to_dict()]


def cmd_down(args: argparse.Namespace) -> int:
    from testbed.cluster_lease import hold
    from testbed.trial_args import wait_seconds

    wait_s = wait_seconds(args)
    names = backends.all_cluster_names() if args.all else [registry.check_name(args.name)]
    removed_any = False
    failed = []
    for name in names:
        try:  # one cluster that cannot be removed (in use, broken) must not keep `--all` from the others
            with hold(name, wait_s=wait_s, force=args.force, restore_shaping=False):
                done = backends.down(name)
        except TestbedError as e:
            if not args.all:
                raise
            failed.append(name)
            err_console.print(f"testbed down: cluster {name}: {e}", markup=False, highlight=False, soft_wrap=True)
            continue
        if done:
            removed_any = True
            console.print(f"cluster [bold]{name}[/]: {done}")
    if not removed_any and not failed:
        console.print("nothing to remove" if args.all else f"cluster {args.name!r} is not up; nothing to remove")
    return 1 if failed else 0


def _print_hosts(status: dict) -> None:
    table = Table(title=f"cluster {status['name']} ({status['backend']})")
    with_gpus = any(h.get("gpus") for h in status["hosts"])
    for col in ("host", "address", "iface", "namespace", "upload", "download", "shaped traffic", "tx bytes", "drops"):
        table.add_column(col)
    if with_gpus:
        table.add_column("gpus")
    for h in status["hosts"]:
        links = h.get("links", {})
        up, down = links.get("upload", {}), links.get("download", {})
        gpu_cell = [",".join(map(str, h.get("gpus") or [])) or "-"] if with_gpus else []
        table.add_row(
            h["name"],
            h["address"],
            h["data_iface"],
            str(h.get("netns") or "-"),
            _link_text(up),
            _link_text(down),
            _classifier_text(h, up),
            str(up.get("sent_bytes", "-")),
            f"{up.get('drops', 0)}/{down.get('drops', 0)}",
            *gpu_cell,
        )
    console.print(table)
    if (status.get("racks") or {}).get("summary"):
        console.print(f"racks: {status['racks']['summary']}", markup=False)


def _classifier_text(host: dict, link: dict) -> str:
    """What the host's shaping applies to: every packet, or the traffic to/from its peers (shaping.classify)."""
    from shaping.classify import describe

    if not link or not link.get("owned"):
        return "-"
    return describe(tuple(host.get("peers") or link.get("peers") or ()))


def _link_text(link: dict) -> str:
    if not link or not link.get("owned"):
        return "unshaped" if link else "-"
    burst = f" burst {format_size(link['burst_bytes'])}" if link.get("burst_bytes") else ""
    return f"{link['qdisc']} {format_rate(link['rate_bps'])}{burst}"


def _half_made_line(name: str, namespaces: list[str]) -> str:
    return (
        f"cluster {name!r} is half-made: namespaces {', '.join(namespaces)} exist without a cluster record "
        f"(an interrupted `up`?); `testbed down --name {name}` removes them"
    )


def cmd_status(args: argparse.Namespace) -> int:
    if args.all:
        data, broken = [], {}
        for n in registry.recorded_names():  # one broken cluster must not hide the others
            try:
                data.append(backends.open_cluster(n).status())
            except TestbedError as e:
                broken[n] = f"cluster {n!r} is recorded but cannot be read ({e}); `testbed down --name {n}` removes it"
        half = backends.half_made_clusters()
        if args.json:
            print_json(
                data
                + [{"name": n, "broken": True, "error": line} for n, line in broken.items()]
                + [{"name": n, "half_made": True, "namespaces": ns} for n, ns in half.items()]
            )
        else:
            for status in data:
                _print_hosts(status)
            for line in broken.values():
                console.print(line)
            for n, ns in half.items():
                console.print(_half_made_line(n, ns))
            if not data and not half and not broken:
                console.print("no cluster is up")
        return 1 if half or broken else 0
    if registry.load_record(registry.check_name(args.name)) is None:
        half = backends.half_made_clusters(args.name)
        if half:
            if args.json:
                print_json({"name": args.name, "half_made": True, "namespaces": half[args.name]})
                return 1
            raise ClusterError(_half_made_line(args.name, half[args.name]))
    status = backends.open_cluster(args.name).status()
    status["in_use_by"] = registry.lease_status(args.name)  # read only: status never waits for the lease
    unfinished = None if status["in_use_by"] else registry.unfinished_trial(args.name)
    if unfinished:
        status["unfinished_trial"] = unfinished
    if args.json:
        print_json(status)
        return 0
    _print_hosts(status)
    if status["in_use_by"]:
        console.print(f"in use by {registry.describe_holder(status['in_use_by'])}", markup=False)
    if unfinished:
        console.print(
            f"the {unfinished['what']} of pid {unfinished['pid']} was killed; the next command on the cluster (run, "
            f"sweep, calibrate, probe, shape, down) ends its {unfinished['processes']} leftover processes, restores "
            "the shaping and stores its row",
            markup=False,
        )
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("exec needs a command: testbed exec HOST -- CMD [ARGS...]")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise InputError(f"--timeout {args.timeout:g}: expected a positive number of seconds")
    cluster = backends.open_cluster(args.name)
    host = cluster.host(args.host)
    prefix = cluster.command_prefix(host)
    if prefix is not None:
        os.execvp(prefix[0], [*prefix, *argv])  # hand the terminal to the command
    done = cluster.run(host, argv, timeout_s=args.timeout)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def _selected_hosts(cluster, spec: str | None):
    if spec is None:
        return None
    names = [n.strip() for n in spec.split(",")]
    if not all(names):
        raise InputError(f"--hosts {spec!r}: an empty host name; expected comma-separated names of cluster "
                         f"{cluster.name!r}: {', '.join(h.name for h in cluster.hosts())}")
    return [cluster.host(n) for n in names]


def cmd_shape(args: argparse.Namespace) -> int:
    bw_none = bw_is_unshaped(args)
    shape = shape_from_args(args)
    tolerance = _tolerance(args)
    if bw_none and not args.clear:
        raise InputError("shape --bw none: to remove the shaping use --clear")
    if shape is None and not args.clear:
        raise InputError("shape needs --bw RATE or --clear")
    if shape is not None and args.clear:
        raise InputError("--bw and --clear exclude each other")
    cluster = backends.open_cluster(args.name)
    hosts = _selected_hosts(cluster, args.hosts)
    if args.dry_run:
        from shaping import classify

        for host, direction, ns, ifname in cluster.links(hosts):
            peers = () if args.clear else cluster.shaping_peers(host)
            if args.clear:
                lines = render_clear(ifname, ns)
            elif direction == "upload":
                lines = render_tc(ifname, shape, ns, peers)
            else:  # a lab host's download is its ifb: the classifier sits on the NIC's ingress redirect
                redirect = classify.render_ingress_filters("tc", host.data_iface, ifname, peers) if peers else []
                lines = redirect + render_tc(ifname, shape, ns)
            head = f"# {direction} {ns}/{ifname}" + (f" (shaped: {classify.describe(peers)})" if peers else "")
            sys.stdout.write(head + "\n" + "\n".join(lines) + "\n")
        return 0
    from testbed.cluster_lease import hold
    from testbed.trial_args import wait_seconds

    with hold(cluster.name, wait_s=wait_seconds(args)):  # never while a trial runs on these links
        cluster = backends.open_cluster(args.name)
        hosts = _selected_hosts(cluster, args.hosts)
        if args.clear:
            cluster.clear_shaping(hosts)
            console.print(f"cluster {cluster.name}: shaping cleared on {'all hosts' if hosts is None else args.hosts}")
        else:
            cluster.apply_shaping(shape, hosts, force=args.force)
            console.print(
                f"cluster {cluster.name}: {shape.describe()} on "
                f"{'every link' if hosts is None else args.hosts} (both directions)"
            )
        if args.verify:
            _verify(cluster, shape, tolerance)
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from testbed.probe import all_pairs, check_probe_args, probe_pair, ring_pairs

    streams = int_list(args.streams, "--streams")
    for s in streams:
        check_probe_args(args.duration, s)
    tolerance = _tolerance(args)
    if args.max_pairs < 1:
        raise InputError(f"--max-pairs {args.max_pairs}: expected an integer >= 1")
    if args.pairs and args.all_pairs:
        raise InputError("--pairs and --all-pairs exclude each other")
    cluster = backends.open_cluster(args.name)
    hosts = cluster.hosts()
    if args.all_pairs:
        pairs = all_pairs(hosts)
    elif args.pairs:
        pairs = []
        for spec in args.pairs.split(","):
            src, _, dst = spec.partition(":")
            if not dst:
                raise InputError(f"--pairs {spec!r}: expected SRC:DST, e.g. h0:h1")
            pairs.append((cluster.host(src), cluster.host(dst)))
    else:
        pairs = ring_pairs(hosts)[: args.max_pairs]
    from testbed.cluster_lease import hold
    from testbed.trial_args import wait_seconds

    results = []
    with hold(cluster.name, wait_s=wait_seconds(args)):  # a trial's shaping or traffic would falsify the measurement
        cluster = backends.open_cluster(args.name)
        shape = cluster.recorded_shape()
        requested = shape.rate_bps if shape else None
        with console.status("probing with iperf3...") if not args.json else contextlib.nullcontext():
            for src, dst in pairs:
                for s in streams:
                    results.append(
                        probe_pair(cluster, src, dst, requested_bps=requested, duration_s=args.duration, streams=s,
                                   burst_bytes=shape.effective_burst_bytes if shape else None)  # fmt: skip
                    )
    bad = [r for r in results if not r.within(tolerance)]
    if args.json:
        print_json({"tolerance": tolerance, "results": [r.to_dict() for r in results], "ok": not bad})
    else:
        table = Table(title=f"iperf3 probe, cluster {cluster.name} ({args.duration:g} s per run)")
        for col in (
            "src",
            "dst",
            "streams",
            "requested",
            "ideal goodput",
            "achieved",
            "achieved/ideal",
            "retransmits",
            "iperf3 procs",
            "",
        ):
            table.add_column(col, justify="right")
        for r in results:
            table.add_row(
                r.src,
                r.dst,
                str(r.streams),
                rate_or_unshaped(r.requested_bps),
                format_rate(r.ideal_goodput_bps) if r.ideal_goodput_bps else "-",
                format_rate(r.achieved_bps),
                f"{r.ratio:.3f}" if r.ratio else "-",
                str(r.retransmits),
                f"{r.processes} ({r.iperf3_version or '?'})",
                "ok" if r.within(tolerance) else "[red]OUT OF TOLERANCE[/]",
            )
        console.print(table)
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="testbed", description="Network-shaping testbed for gradient compression.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    p = sub.add_parser("up", help="bring up a cluster (emulated hosts, or lab hosts with --inventory)")
    add_name(p)
    add_json(p)
    p.add_argument("--hosts", type=int, help="number of emulated hosts (default 4)")
    p.add_argument("--subnet", help="private IPv4 subnet for host addresses (default 10.77.0.0/24)")
    p.add_argument("--recreate", action="store_true", help="tear down an existing cluster of this name first")
    p.add_argument("--gpus", help="emulated hosts: this machine's GPUs to share out among the hosts: all, none "
                   "(default) or indices 0,1,... (each host gets CUDA_VISIBLE_DEVICES and its own NCCL host id)")
    p.add_argument("--verify", action="store_true", help="probe h0->h1 with iperf3 after shaping")
    _add_tolerance_flag(p, "--verify fails")
    p.add_argument("--racks", type=int, help="emulated hosts: this many racks (a switch each, joined through a spine; "
                   "must divide --hosts)")
    p.add_argument("--uplink", help="emulated racks: each rack's spine link, shaped both directions, e.g. 4gbit")
    p.add_argument("--inventory", help="Ansible inventory of lab hosts (instead of emulated hosts)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="lab: trust unknown SSH host keys on first use and record them (a changed key is still refused)")
    p.add_argument("--allow-cpu", action="store_true", help="lab: accept hosts without the GPUs the inventory lists")
    p.add_argument("--no-provision", action="store_true", help="lab: skip the provision playbook")
    p.add_argument("--slurm", action="store_true", help="inside a Slurm allocation (salloc/sbatch): its nodes are the "
                   "hosts, commands and ranks run as srun steps (no SSH)")
    p.add_argument("--iface", help="slurm: the data NIC of every node (default: the inventory's testbed_data_iface)")
    add_shape_flags(p)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="remove everything a cluster made (idempotent; also after a crash)")
    add_name(p)
    p.add_argument("--all", action="store_true", help="every testbed cluster on this machine (only namespaces the "
                   "testbed marked as its own; one that cannot be removed is reported and the others still are)")
    p.add_argument("--force", action="store_true", help="go ahead when the cluster's lease is held by a command that "
                   "is no longer running (a live holder is still refused)")
    add_wait_flag(p)
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("status", help="hosts, addresses, per-link shaping and counters")
    add_name(p)
    add_json(p)
    p.add_argument("--all", action="store_true", help="every cluster that is up")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("exec", help="run a command on a host: testbed exec h1 -- ip addr")
    add_name(p)
    p.add_argument("host")
    p.add_argument("--timeout", type=float, default=600.0, help="lab hosts: seconds before the command is ended")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("shape", help="change shaping live on every link (or --hosts)")
    add_name(p)
    add_shape_flags(p)
    p.add_argument("--hosts", help="comma-separated host names (default: all)")
    p.add_argument("--clear", action="store_true", help="remove shaping, restoring what was there")
    p.add_argument("--dry-run", action="store_true", help="print the equivalent tc commands, change nothing")
    p.add_argument("--verify", action="store_true", help="probe h0->h1 with iperf3 afterwards")
    _add_tolerance_flag(p, "--verify fails")
    add_wait_flag(p)
    p.set_defaults(func=cmd_shape)

    p = sub.add_parser("probe", help="measure achieved throughput between hosts with iperf3")
    add_name(p)
    add_json(p)
    p.add_argument("--streams", default="1", help="parallel TCP streams, comma-separated runs (default 1), e.g. 1,4")
    p.add_argument("--duration", type=float, default=2.0, help="seconds per iperf3 run (default 2)")
    p.add_argument("--pairs", help="SRC:DST pairs, e.g. h0:h1,h2:h3 (default: a ring over all hosts)")
    p.add_argument("--max-pairs", type=int, default=4, help="at most this many ring pairs (default 4)")
    p.add_argument(
        "--all-pairs",
        action="store_true",
        help="every ordered pair of hosts, one at a time (n x (n-1) runs; ignores --max-pairs)",
    )
    _add_tolerance_flag(p, "the link is flagged")
    add_wait_flag(p)
    p.set_defaults(func=cmd_probe)

    run_cli.add_commands(sub)  # run, sweep, results
    model_cli.add_commands(sub)  # profile, predict, report
    plugin_cli.add_commands(sub)  # compressors, check-compressor
    crossover_cli.add_commands(sub)  # crossover
    return parser


_POSITIONALS = {"path": "PATH", "results_dir": "RESULTS_DIR", "host": "HOST", "spec": "SPEC"}


def refuse_empty_values(args: argparse.Namespace) -> None:
    """An empty string is never a value: `--burst ''` must not quietly mean "the default" (nor `--out ''` the cwd)."""
    for key, value in vars(args).items():
        if key != "name" and isinstance(value, str) and not value.strip():
            what = _POSITIONALS.get(key) or f"--{key.replace('_', '-')}"
            raise InputError(f"{what} {value!r}: empty; give a value or leave the flag out for its default")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a closed SSH session, a Slurm time limit, a CI cancel: Ctrl-C
        signal.signal(signum, _interrupted)
    try:
        refuse_empty_values(args)
        return int(args.func(args) or 0)
    except TestbedError as e:
        if args.debug:
            raise
        err_console.print(f"testbed {args.command}: error: {e}", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err_console.print(f"testbed {args.command}: interrupted; what it had started was rolled back", markup=False)
        return 128 + (_SIGNALLED[0] if _SIGNALLED else signal.SIGINT)


_SIGNALLED: list[int] = []


def _interrupted(signum, frame):
    """SIGTERM and SIGHUP stop a command the way Ctrl-C does (what it started is rolled back); `run`, `sweep` and
    `calibrate` replace this with launch.stop_on_signals (the trial stops at its next poll, its row stored)."""
    if os.getpid() != _MAIN_PID:  # a child forked by a library (pyroute2's netns helper) just ends
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt


_MAIN_PID = os.getpid()


if __name__ == "__main__":
    sys.exit(main())
