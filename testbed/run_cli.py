"""`testbed run`, `testbed sweep` and `testbed results`: the product's main job and its results store."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from runners import catalog
from shaping.units import format_rate, format_size, rate_or_unshaped
from testbed import trial_shape
from testbed.caveats import trial_notes
from testbed.cli_common import add_json, add_name, console, print_json
from testbed.cluster import backends, registry
from testbed.config import (
    Trial,
    parse_env_pairs,
    parse_rates,
)
from testbed.errors import InputError
from testbed.trial_args import (
    add_trial_flags,
    add_wait_flag,
    check_data_hosts,
    check_plugin_hosts,
    check_timeout,
    checked_plugin_path,
    cluster_for,
    common_fields,
    compressor_options,
    free_options,
    inspect_plugins,
    located_plugin,
    netem_probe,
    open_store,
    plugin_of,
    probe_args,
    sweep_trials,
    wait_seconds,
)

CONFIRM_GRID_ABOVE = 50  # a sweep with more trials to run than this asks for --yes (and says how long it may take)
GUESS_TRIAL_S = 60.0  # ETA per trial when the results directory holds no finished trial to go by

# ---------------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from testbed import launch_plan
    from testbed.cluster_lease import hold
    from testbed.launch import STOP, make_plan, run_trial, stop_exit_code, stop_on_signals

    if not args.bw:
        raise InputError("run needs --bw RATE (e.g. 500mbit), or --bw none for an unshaped run")
    from testbed.plugins import resolve_name

    rate = parse_rates([args.bw])[0]
    opts = {**compressor_options(args), **free_options(args)}
    check_timeout(args.timeout)
    wait_seconds(args)
    probe_args(args)  # the per-trial probe's settings, checked before anything starts
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    trial = Trial(
        compressor=resolve_name(args.compressor),
        rate_bps=rate,
        world_size=args.world_size or (args.ranks_per_host or 1),  # placeholder until resolved against the hosts
        options=tuple(sorted(opts.items())),
        plugin_path=checked_plugin_path(args),
        **common_fields(args),
    )
    store = open_store(args.out)  # checked writable before anything is looked up or started
    infos = {} if args.dry_run else inspect_plugins([trial])  # --dry-run never imports (runs) a plugin
    cluster = cluster_for(args, trial.world_size)
    # backend, ranks per host and world size made concrete for this cluster's hosts (exit 2 if they cannot run it)
    (trial,) = launch_plan.resolve_on(cluster, [trial], world_size_given=args.world_size is not None)
    trial_shape.check_on_cluster([trial], cluster, netem_probe(cluster))  # --host-bw hosts, netem: exit 2
    if args.dry_run:  # what would start: nothing is shaped, started or stored
        from pathlib import Path

        out = Path(args.out) / "trials" / trial.trial_id
        plan = make_plan(cluster, trial, cluster.rank_out_dir(out, trial.trial_id), timeout_s=args.timeout,
                         user_env=user_env)  # fmt: skip
        print_json({"trial_id": trial.trial_id, "trial": trial.config(), "plugin": located_plugin(trial),
                    "plan": plan.to_json()})  # fmt: skip
        return 0
    stored = store.find(trial.trial_id)
    if stored is not None and stored["status"] == "ok" and not args.rerun:
        raise InputError(
            f"trial {trial.trial_id} is already stored ok in {store.root} (attempt {stored['attempt']}, "
            f"{stored['started_at']}); add --rerun to measure it again as a new attempt (the stored one is kept)"
        )
    check_plugin_hosts(cluster, [trial], infos)
    check_data_hosts(cluster, [trial])
    with hold(args.name, wait_s=wait_seconds(args)):
        cluster = backends.open_cluster(args.name)  # read again under the lease: the shaping to restore is current
        stop_on_signals()
        with console.status(f"{trial.label()}: starting") as status:
            row = run_trial(
                cluster,
                trial,
                store,
                timeout_s=args.timeout,
                probe=not args.no_probe,
                on_phase=lambda phase: status.update(f"{trial.label()}: {phase}"),
                user_env=user_env,
                **probe_args(args),
                plugin=plugin_of(trial, infos),
            )
    baseline = store.find(trial.baseline().trial_id) if trial.compressor != "syncsgd" else None
    if args.json:
        print_json({"trial": trial.config(), "row": row, "baseline_row": baseline})
    else:
        print_run_summary(trial, row, baseline)
    if STOP.is_set():
        return stop_exit_code()
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
    if row.get("comm_wire_s") is not None:  # the overlap split (runners/timeline.py; null for built-in syncsgd)
        table.add_row(
            "communication hidden / exposed",
            f"{row['comm_hidden_s'] * 1e3:.1f} / {row['comm_exposed_s'] * 1e3:.1f} ms of {row['comm_wire_s'] * 1e3:.1f}",
        )
    if row.get("codec_critical_s") is not None:
        table.add_row(
            "codec on / off the critical path", f"{row['codec_critical_s'] * 1e3:.1f} / {row['codec_hidden_s'] * 1e3:.1f} ms"
        )
    if row.get("timeline_iters") or row.get("trace_iters"):
        table.add_row("timeline / trace iterations kept", f"{row.get('timeline_iters') or 0} / {row.get('trace_iters') or 0}"
                      " (testbed report draws them)")  # fmt: skip
    table.add_row("payload per iteration (per rank)", format_size(row["payload_bytes_per_iter"] or 0))
    table.add_row("wire tx per iteration (per rank)", format_size(row["wire_tx_bytes_per_iter"] or 0))
    req = rate_or_unshaped(row["rate_bps"])
    meas = format_rate(row["measured_goodput_bps"]) if row.get("measured_goodput_bps") else "not probed"
    table.add_row("link: requested / measured goodput", f"{req} / {meas}")
    table.add_row("warm-up iterations (not measured)", str(row["warmup_iters"]))
    if row.get("final_test_accuracy") is not None:  # a learning run (issue 33)
        table.add_row("test accuracy (last evaluation)", f"{row['final_test_accuracy']:.4f} after {row['steps_run']} steps")
        table.add_row("training / evaluation time", f"{row['train_time_s']:.1f} s / {row['eval_time_s']:.1f} s")
    if row.get("target_accuracy") is not None:
        reached = (f"{row['steps_to_target']} steps, {row['train_time_to_target_s']:.1f} s of training"
                   if row.get("reached_target") else f"not reached in {row['steps_run']} steps")  # fmt: skip
        table.add_row(f"to target accuracy {row['target_accuracy']:g}", reached)
    if baseline and baseline.get("status") == "ok":
        table.add_row("speedup over syncsgd", f"{baseline['iter_time_s_mean'] / it:.2f}x")
    elif trial.compressor != "syncsgd":
        table.add_row("speedup over syncsgd", "no matching syncsgd trial stored")
    console.print(table)
    for note in trial_notes(row):
        console.print(f"[yellow]{note}[/]", markup=True)


# ---------------------------------------------------------------------------------------------------- sweep

def _eta_text(store, n: int, timeout_s: float) -> str:
    """How long `n` trials may take: the mean wall time of the stored ok trials, else a stated guess."""
    try:
        df = store.load(missing_ok=True, warn=lambda _m: None)
        walls = df.loc[df["status"] == "ok", "wall_s"].dropna()
    except Exception:  # noqa: BLE001 - an estimate never stops a sweep
        walls = []
    per = float(walls.mean()) if len(walls) else GUESS_TRIAL_S
    basis = f"the mean of {len(walls)} stored trials" if len(walls) else "a guess: no finished trial stored yet"
    return f"ETA about {_duration(n * per)} at ~{per:.0f} s per trial, {basis}; at most {_duration(n * timeout_s)}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _refuse_big_grid(n: int, eta: str) -> None:
    raise InputError(f"sweep: {n} trials to run ({eta}); more than {CONFIRM_GRID_ABOVE} trials need --yes")


def cmd_sweep(args: argparse.Namespace) -> int:
    from testbed import launch_plan
    from testbed.cluster_lease import hold
    from testbed.launch import stop_on_signals

    check_timeout(args.timeout)
    wait_seconds(args)
    probe_args(args)  # the per-trial probe's settings, checked before anything starts
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    trials = sweep_trials(args)
    infos = inspect_plugins(trials)
    store = open_store(args.out)
    if registry.load_record(args.name) is None and len(trials) > CONFIRM_GRID_ABOVE and not args.yes:
        _refuse_big_grid(len(trials), _eta_text(store, len(trials), args.timeout))  # said before "no cluster"
    cluster = cluster_for(args, max(t.world_size for t in trials))
    # concrete backend, ranks per host and racks for this cluster (their trial ids are what the store holds); every
    # trial of the grid must fit before the first one starts
    trials = list(dict.fromkeys(launch_plan.resolve_on(cluster, trials)))
    trial_shape.check_on_cluster(trials, cluster, netem_probe(cluster))  # --host-bw hosts, netem: exit 2
    done = store.stored_ids("ok")
    todo = [t for t in trials if t.trial_id not in done]
    eta = _eta_text(store, len(todo), args.timeout)
    if len(todo) > CONFIRM_GRID_ABOVE and not args.yes:
        _refuse_big_grid(len(todo), eta)
    console.print(
        f"sweep: {len(trials)} trials, {len(trials) - len(todo)} already stored, {len(todo)} to run"
        + (f" ({eta})" if todo else "")
    )
    if not todo:
        return 0
    check_plugin_hosts(cluster, todo, infos)
    check_data_hosts(cluster, todo)
    with hold(args.name, wait_s=wait_seconds(args)):  # the whole grid: no other command shapes the links in between
        cluster = backends.open_cluster(args.name)  # read again under the lease: the shaping to restore is current
        stop_on_signals()
        done = store.stored_ids("ok")  # again: a command waited for may have stored some of them
        return _run_grid(args, cluster, store, [t for t in todo if t.trial_id not in done], infos, user_env)


def _run_grid(args: argparse.Namespace, cluster, store, todo: list[Trial], infos, user_env) -> int:
    """The trials of a sweep, one after another, under the cluster's lease; the exit status."""
    from testbed.launch import STOP, STOPPED_BY, run_trial, stop_exit_code

    failed = 0
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
            row = run_trial(cluster, trial, store, timeout_s=args.timeout, probe=not args.no_probe, user_env=user_env,
                            **probe_args(args), plugin=plugin_of(trial, infos))  # fmt: skip
            if STOP.is_set():
                by = STOPPED_BY[0] if STOPPED_BY else "Ctrl-C"
                progress.console.print(f"interrupted ({by}): {trial.label()} stored as interrupted; run the sweep "
                                       "again to resume")
                return stop_exit_code()
            if row["status"] != "ok":
                failed += 1
                progress.console.print(f"[red]{row['status']}[/] {trial.label()}: {row['error']}")
                if args.fail_fast:
                    break
            else:
                for note in trial_notes(row):
                    progress.console.print(f"[yellow]{note}[/] ({trial.label()})", markup=True)
            progress.advance(task)
    console.print(f"sweep finished: {len(todo) - failed} ok, {failed} failed; results in {store.root}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------- results
def cmd_results(args: argparse.Namespace) -> int:
    from testbed.outputs import check_output_file
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    store = ResultsStore(args.path, flag="results")
    if args.store_pending:
        stored = store.store_pending()
        console.print(f"stored {len(stored)} kept row{'s' if len(stored) != 1 else ''} in {store.rows_dir}")
        return 0
    if args.csv:
        check_output_file(args.csv, "--csv")
    df = store.load(all_attempts=args.attempts)
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
    df = df.sort_values(["model", "world_size", "rate_bps", "compressor", "attempt"])
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
    for _, r in df[[*cols, "attempt"]].iterrows():
        ok = r["status"] == "ok"
        opts = json.loads(r["compressor_options"] or "{}")
        table.add_row(
            r["trial_id"][:8] + (f" #{r['attempt']}" if args.attempts else ""),
            r["status"],
            r["model"],
            str(r["world_size"]),
            rate_or_unshaped(r["rate_bps"]),
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
        "--compressor", default="syncsgd", help=f"{', '.join(catalog.names())}, an "
        "installed plugin's name (testbed compressors) or MODULE:FACTORY (with --plugin-path DIR; a plugin is code, run as "
        "root in local mode)"
    )
    p.add_argument("--world-size", type=int, help="ranks in all (default: every host x --ranks-per-host)")
    p.add_argument("--dry-run", action="store_true", help="print the launch plan (hosts, ranks, argv, environment) "
                   "as JSON and start nothing; a MODULE:FACTORY plugin is located, never imported")  # fmt: skip
    add_trial_flags(p)
    trial_shape.add_flags(p)
    p.add_argument(
        "--rerun",
        action="store_true",
        help="measure a trial already stored ok again, as a new attempt (the stored attempt is kept)",
    )
    add_wait_flag(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a grid of bandwidths x compressors x world sizes (resumable)")
    add_name(p)
    p.add_argument("--config", help="sweep TOML file (see sweeps/); it names code (MODULE:FACTORY compressors, "
                   "plugin_path) that runs as root in local mode: use only files you trust")  # fmt: skip
    p.add_argument("--bw", help="comma-separated rates, e.g. 100mbit,1gbit")
    p.add_argument("--compressor", help="comma-separated compressors (built-in names, plugin names, MODULE:FACTORY: "
                   "a plugin is code, run as root in local mode)")  # fmt: skip
    p.add_argument("--world-size", help="comma-separated world sizes, e.g. 2,4")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed trial")
    p.add_argument("--seeds", type=int, metavar="K", help="run each configuration with K seeds (--seed, --seed+1, ...), "
                   "e.g. convergence runs to --target-accuracy for time to accuracy")
    p.add_argument(
        "--yes", action="store_true", help=f"start a grid of more than {CONFIRM_GRID_ABOVE} trials (the ETA is printed)"
    )
    add_trial_flags(p, sweep=True)
    trial_shape.add_flags(p, sweep=True)
    add_wait_flag(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("results", help="table of the trials stored in a results directory")
    p.add_argument("path", nargs="?", default="results")
    add_json(p)
    p.add_argument("--csv", help="write every column to this CSV file")
    p.add_argument("--attempts", action="store_true", help="every attempt of each trial (default: the best one)")
    p.add_argument("--store-pending", action="store_true",
                   help="store the rows a full or unwritable results directory kept in trials/*/row.pending.json")
    p.set_defaults(func=cmd_results)
