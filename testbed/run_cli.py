"""`testbed run`, `testbed sweep` and `testbed results`: the product's main job and its results store."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from shaping.units import format_rate, format_size
from testbed.cli_common import add_json, add_name, console, print_json
from testbed.cluster import backends, registry
from testbed.config import Trial, expand, load_sweep_toml, parse_env_pairs, parse_list, parse_rates
from testbed.errors import InputError


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "1", "yes"):
        return True
    if text.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected on or off")


OPTION_FLAGS = {  # compressor option -> (flag, type)
    "rank": ("--rank", int),
    "start_iter": ("--start-iter", int),
    "min_compression_rate": ("--min-compression-rate", float),
    "ratio": ("--ratio", float),
    "error_feedback": ("--error-feedback", _on_off),
}


def add_trial_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet18", help="mlp, cnn, resnet18, resnet50, resnet101, bert-base")
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup-iters", type=int, default=5, help="unrecorded; raised to cover the compressor's start-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=64, help="input side for CNNs (default 64)")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length for bert-base (default 128)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size (default 25)")
    p.add_argument("--serial", action="store_true", help="separate phases cleanly (no overlap), for profiling")
    p.add_argument("--burst", help="token bucket size (default: 1 ms of data, >= 64 KB)")
    p.add_argument("--qdisc", default="htb", help="htb or tbf")
    p.add_argument("--out", default="results", help="results directory (default ./results)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a trial is stopped (default 600)")
    p.add_argument("--no-probe", action="store_true", help="skip the iperf3 check before each trial")
    p.add_argument("--runner-module", default="runners.train", help=argparse.SUPPRESS)
    p.add_argument("--overlap", type=_on_off, default=True, metavar="on|off",
                   help="on (default): compressor hooks overlap backward; off: hooks block (Agarwal et al.'s serial)")
    p.add_argument("--skew-probe", action="store_true", help="record per-collective peer skew (peer_wait_s), "
                   "apart from comm_s; costs one tiny all-gather per collective")
    g = p.add_argument_group("placement and collectives (GPU hosts: NCCL over sockets)")
    g.add_argument("--backend", default="auto", help="auto (default: nccl when every host used has CUDA), nccl, gloo")
    g.add_argument("--ranks-per-host", type=int, help="torchrun's nproc-per-node (default: the hosts' GPUs, else 1)")
    g.add_argument("--intra-host", default="p2p", help="p2p (default: NVLink/P2P/SHM inside a host) or socket")
    g.add_argument("--nccl-socket-nthreads", type=int, help="NCCL_SOCKET_NTHREADS (x nsocks-perthread <= 64)")
    g.add_argument("--nccl-nsocks-perthread", type=int, help="NCCL_NSOCKS_PERTHREAD")
    g.add_argument("--nccl-env", action="append", metavar="NCCL_KEY=VAL", help="further NCCL_* setting (repeatable)")
    g.add_argument("--env", action="append", metavar="KEY=VAL",
                   help="a variable every rank gets (repeatable); nothing else of this shell reaches the ranks "
                   "but NCCL_*/GLOO_*/TORCH_*/CUDA_* and OMP/MKL thread counts")  # fmt: skip
    for key, (flag, kind) in OPTION_FLAGS.items():
        p.add_argument(flag, dest=f"opt_{key}", type=kind, help=f"compressor option {key}")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, f"opt_{k}") for k in OPTION_FLAGS if getattr(args, f"opt_{k}", None) is not None}


def _common(args: argparse.Namespace) -> dict[str, Any]:
    from shaping.units import parse_size_bytes

    return dict(
        model=args.model,
        batch_size=args.batch_size,
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        seed=args.seed,
        image_size=args.image_size,
        seq_len=args.seq_len,
        bucket_cap_mb=args.bucket_cap_mb,
        serial=args.serial,
        overlap=args.overlap,
        skew_probe=args.skew_probe,
        backend=args.backend,
        ranks_per_host=args.ranks_per_host,
        intra_host=args.intra_host,
        nccl_socket_nthreads=args.nccl_socket_nthreads,
        nccl_nsocks_perthread=args.nccl_nsocks_perthread,
        nccl_env=parse_env_pairs(args.nccl_env, "--nccl-env"),
        qdisc=args.qdisc,
        cluster=args.name,
        runner=args.runner_module,
        burst_bytes=parse_size_bytes(args.burst, "--burst") if args.burst else None,
    )


def _cluster_for(args: argparse.Namespace, world_size: int):
    """The named cluster; brought up (local, unshaped, world_size hosts) when it is not up yet."""
    if registry.load_record(args.name) is None:
        from testbed.cluster.local import LocalCluster

        console.print(f"cluster {args.name!r} is not up: bringing up {world_size} emulated hosts")
        cluster, _ = LocalCluster.up(args.name, max(world_size, 2))
        return cluster
    return backends.open_cluster(args.name)


# ---------------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from testbed import launch_plan
    from testbed.launch import make_plan, run_trial, stop_on_ctrl_c
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    if not args.bw:
        raise InputError("run needs --bw RATE (e.g. 500mbit), or --bw none for an unshaped run")
    rate = parse_rates([args.bw])[0]
    opts = _options(args)
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    store = ResultsStore(args.out)
    record = registry.load_record(args.name)
    trial = Trial(
        compressor=args.compressor,
        rate_bps=rate,
        world_size=args.world_size or (args.ranks_per_host or 1),  # placeholder until resolved against the hosts
        options=tuple(sorted(opts.items())),
        **_common(args),
    )
    if args.dry_run:  # print what would start: nothing is brought up, shaped or started
        if record is None:
            raise InputError(f"--dry-run needs a cluster that is up; start one with `testbed up --name {args.name}`")
        cluster = backends.open_cluster(args.name)
        trial = launch_plan.resolve(trial, cluster.hosts(), world_size_given=args.world_size is not None)
        out = store.trial_dir(trial.trial_id)
        plan = make_plan(cluster, trial, cluster.rank_out_dir(out, trial.trial_id), timeout_s=args.timeout,
                         user_env=user_env)  # fmt: skip
        print_json({"trial_id": trial.trial_id, "trial": trial.config(), "plan": plan.to_json()})
        return 0
    cluster = _cluster_for(args, trial.world_size)
    trial = launch_plan.resolve(trial, cluster.hosts(), world_size_given=args.world_size is not None)
    stop_on_ctrl_c()
    with console.status(f"{trial.label()}: starting") as status:
        row = run_trial(
            cluster,
            trial,
            store,
            timeout_s=args.timeout,
            probe=not args.no_probe,
            on_phase=lambda phase: status.update(f"{trial.label()}: {phase}"),
            user_env=user_env,
        )
    baseline = store.find(trial.baseline().trial_id) if trial.compressor != "syncsgd" else None
    if args.json:
        print_json({"trial": trial.config(), "row": row, "baseline_row": baseline})
    else:
        print_run_summary(trial, row, baseline)
    return 0 if row["status"] == "ok" else 1


def print_run_summary(trial: Trial, row: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    if row["status"] != "ok":
        console.print(f"[red]trial {row['trial_id']} {row['status']}[/]: {row['error']}", markup=True)
        return
    it = row["iter_time_s_mean"]
    table = Table(title=f"{trial.label()}  (trial {row['trial_id']})", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "iteration time mean / p50 / p95",
        f"{it * 1e3:.1f} / {row['iter_time_s_p50'] * 1e3:.1f} / {row['iter_time_s_p95'] * 1e3:.1f} ms",
    )
    table.add_row("throughput", f"{row['samples_per_s']:.1f} samples/s")
    phases = ("forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s")
    total = sum(row[p] or 0 for p in phases) or 1
    table.add_row(
        "time share fwd/bwd/enc/comm/dec/opt", " / ".join(f"{100 * (row[p] or 0) / total:.0f}%" for p in phases)
    )
    table.add_row("payload per iteration (per rank)", format_size(row["payload_bytes_per_iter"] or 0))
    table.add_row("wire tx per iteration (per rank)", format_size(row["wire_tx_bytes_per_iter"] or 0))
    req = format_rate(row["rate_bps"]) if row["rate_bps"] else "unshaped"
    meas = format_rate(row["measured_goodput_bps"]) if row.get("measured_goodput_bps") else "not probed"
    table.add_row("link: requested / measured goodput", f"{req} / {meas}")
    table.add_row("warm-up iterations (not measured)", str(row["warmup_iters"]))
    if baseline and baseline.get("status") == "ok":
        table.add_row("speedup over syncsgd", f"{baseline['iter_time_s_mean'] / it:.2f}x")
    elif trial.compressor != "syncsgd":
        table.add_row("speedup over syncsgd", "no matching syncsgd trial stored")
    console.print(table)


# ---------------------------------------------------------------------------------------------------- sweep
def cmd_sweep(args: argparse.Namespace) -> int:
    from testbed.launch import STOP, run_trial, stop_on_ctrl_c
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    store = ResultsStore(args.out)
    if args.config:
        trials = load_sweep_toml(args.config, cluster=args.name, runner=args.runner_module)
    else:
        if not (args.bw and args.compressor and args.world_size):
            raise InputError("sweep needs --config FILE, or --bw, --compressor and --world-size lists")
        try:
            sizes = [int(x) for x in parse_list(args.world_size, "--world-size")]
        except ValueError:
            raise InputError(f"--world-size {args.world_size!r}: expected comma-separated integers") from None
        options = {c: _options(args) for c in parse_list(args.compressor, "--compressor")} if _options(args) else {}
        trials = expand(
            parse_rates(parse_list(args.bw, "--bw")),
            parse_list(args.compressor, "--compressor"),
            sizes,
            options=options,
            **_common(args),
        )
    from testbed import launch_plan

    cluster = _cluster_for(args, max(t.world_size for t in trials))
    hosts = cluster.hosts()
    trials = list(dict.fromkeys(launch_plan.resolve(t, hosts) for t in trials))  # concrete backend, ranks per host
    done = store.stored_ids("ok")
    todo = [t for t in trials if t.trial_id not in done]
    console.print(f"sweep: {len(trials)} trials, {len(trials) - len(todo)} already stored, {len(todo)} to run")
    if not todo:
        return 0
    failed = 0
    stop_on_ctrl_c()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(todo))
        for trial in todo:
            progress.update(task, description=trial.label())
            row = run_trial(cluster, trial, store, timeout_s=args.timeout, probe=not args.no_probe)
            if STOP.is_set():
                progress.console.print(f"interrupted: {trial.label()} stored as failed; run the sweep again to resume")
                return 130
            if row["status"] != "ok":
                failed += 1
                progress.console.print(f"[red]{row['status']}[/] {trial.label()}: {row['error']}")
                if args.fail_fast:
                    break
            progress.advance(task)
    console.print(f"sweep finished: {len(todo) - failed} ok, {failed} failed; results in {store.root}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------- results
def cmd_results(args: argparse.Namespace) -> int:
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    store = ResultsStore(args.path)
    df = store.load()
    if args.csv:
        df.to_csv(args.csv, index=False)
        console.print(f"wrote {len(df)} rows to {args.csv}")
        return 0
    cols = [
        "trial_id",
        "status",
        "model",
        "world_size",
        "rate_bps",
        "compressor",
        "compressor_options",
        "iter_time_s_mean",
        "samples_per_s",
        "payload_bytes_per_iter",
        "wire_tx_bytes_per_iter",
        "measured_goodput_bps",
    ]
    df = df.sort_values(["model", "world_size", "rate_bps", "compressor"])
    if args.json:
        print_json(json.loads(df.to_json(orient="records")))
        return 0
    table = Table(title=f"{len(df)} trials in {store.root}")
    for c in (
        "trial",
        "status",
        "model",
        "ranks",
        "rate",
        "compressor",
        "iter ms",
        "samples/s",
        "payload/iter",
        "wire tx/iter",
        "measured",
    ):
        table.add_column(c, justify="right")
    for _, r in df[cols].iterrows():
        ok = r["status"] == "ok"
        opts = json.loads(r["compressor_options"] or "{}")
        table.add_row(
            r["trial_id"][:8],
            r["status"],
            r["model"],
            str(r["world_size"]),
            format_rate(r["rate_bps"]) if r["rate_bps"] else "unshaped",
            r["compressor"] + "".join(f" {k}={v}" for k, v in opts.items()),
            f"{r['iter_time_s_mean'] * 1e3:.1f}" if ok else "-",
            f"{r['samples_per_s']:.1f}" if ok else "-",
            format_size(r["payload_bytes_per_iter"]) if ok else "-",
            format_size(r["wire_tx_bytes_per_iter"]) if ok else "-",
            format_rate(r["measured_goodput_bps"])
            if r["measured_goodput_bps"] == r["measured_goodput_bps"] and r["measured_goodput_bps"]
            else "-",
        )
    console.print(table)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("run", help="one shaped training trial on the cluster")
    add_name(p)
    add_json(p)
    p.add_argument("--bw", help="link rate for this trial, e.g. 500mbit (or none)")
    p.add_argument(
        "--compressor", default="syncsgd", help="syncsgd, fp16, bf16, powersgd, acpsgd, signsgd, topk, mstopk"
    )
    p.add_argument("--world-size", type=int, help="ranks in all (default: every host x --ranks-per-host)")
    p.add_argument("--dry-run", action="store_true", help="print the launch plan (hosts, ranks, argv, environment) "
                   "as JSON and start nothing")  # fmt: skip
    add_trial_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a grid of bandwidths x compressors x world sizes (resumable)")
    add_name(p)
    p.add_argument("--config", help="sweep TOML file (see sweeps/)")
    p.add_argument("--bw", help="comma-separated rates, e.g. 100mbit,1gbit")
    p.add_argument("--compressor", help="comma-separated compressors")
    p.add_argument("--world-size", help="comma-separated world sizes, e.g. 2,4")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed trial")
    add_trial_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("results", help="table of the trials stored in a results directory")
    p.add_argument("path", nargs="?", default="results")
    add_json(p)
    p.add_argument("--csv", help="write every column to this CSV file")
    p.set_defaults(func=cmd_results)
