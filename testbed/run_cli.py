"""`testbed run`, `testbed sweep` and `testbed results`: the product's main job and its results store."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from runners import catalog
from runners.contract import TRAINING_DEFAULTS, RankArgs
from shaping.units import format_rate, format_size, rate_or_unshaped
from testbed import trial_shape
from testbed.cli_common import add_json, add_name, console, print_json
from testbed.cluster import backends, registry
from testbed.config import (
    LEARNING_DEFAULTS,
    OBSERVATION_FIELDS,
    Trial,
    expand,
    load_sweep_toml,
    parse_env_pairs,
    parse_list,
    parse_rates,
)
from testbed.errors import InputError

MAX_TIMEOUT_S = 7 * 24 * 3600.0
CONFIRM_GRID_ABOVE = 50  # a sweep with more trials to run than this asks for --yes (and says how long it may take)
GUESS_TRIAL_S = 60.0  # ETA per trial when the results directory holds no finished trial to go by


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "1", "yes"):
        return True
    if text.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected on or off")


_FLAG_TYPES = {"int": int, "float": float, "bool": _on_off, "choice": str}
# compressor option -> (flag, type), from the torch-free catalogue (runners/catalog.py)
OPTION_FLAGS = {key: (flag, _FLAG_TYPES[kind]) for key, (flag, kind) in catalog.option_flags().items()}

# trial settings a sweep file also sets: with --config, giving one of these flags is refused (it would be ignored)
TRIAL_FLAG_DEFAULTS: dict[str, Any] = {
    **dataclasses.asdict(TRAINING_DEFAULTS),  # model, batch size, iterations, warm-up, seed, input sizes, bucket cap
    "serial": False,
    "burst": None,
    "qdisc": "htb",
    "overlap": True,
    "skew_probe": False,
    "timeline_iters": 0,
    "trace_iters": 0,
    "backend": "auto",
    "ranks_per_host": None,
    "intra_host": "p2p",
    "nccl_socket_nthreads": None,
    "nccl_nsocks_perthread": None,
    "nccl_env": None,
    **LEARNING_DEFAULTS,  # --data, --eval-every, --target-accuracy, --max-steps, --lr (their home: testbed.config)
}


def _option_help(key: str) -> str:
    users = catalog.who_accepts(key)
    first = catalog.compressor(users[0]).option(key)
    accepted = "on or off" if first.type == "bool" else first.accepted
    return f"{', '.join(users)}: {first.help}; {accepted}"


def add_trial_flags(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The trial flags; for `sweep` their defaults are None so that a flag given beside --config is seen."""
    d = {k: None for k in TRIAL_FLAG_DEFAULTS} if sweep else TRIAL_FLAG_DEFAULTS
    models = ", ".join(catalog.MODEL_NAMES)
    p.add_argument("--model", default=d["model"], help=f"{models} (default {TRAINING_DEFAULTS.model})")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help=f"per rank (default {TRAINING_DEFAULTS.batch_size})")
    p.add_argument("--iters", type=int, default=d["iters"], help=f"measured iterations (default {TRAINING_DEFAULTS.iters})")
    p.add_argument(
        "--warmup-iters",
        type=int,
        default=d["warmup_iters"],
        help=f"unrecorded; raised to cover the compressor's start-up (default {TRAINING_DEFAULTS.warmup_iters})",
    )
    p.add_argument("--seed", type=int, default=d["seed"])
    lo, hi = catalog.IMAGE_SIZE_RANGE
    p.add_argument(
        "--image-size", type=int, default=d["image_size"], help=f"input side for CNNs, {lo}..{hi} (default {TRAINING_DEFAULTS.image_size})"
    )
    lo, hi = catalog.SEQ_LEN_RANGE
    p.add_argument(
        "--seq-len", type=int, default=d["seq_len"], help=f"sequence length for bert-base, {lo}..{hi} (default {TRAINING_DEFAULTS.seq_len})"
    )
    p.add_argument("--bucket-cap-mb", type=float, default=d["bucket_cap_mb"],
                   help=f"DDP bucket size (default {TRAINING_DEFAULTS.bucket_cap_mb:g})")  # fmt: skip
    p.add_argument(
        "--serial",
        action="store_true",
        default=d["serial"],
        help="separate phases cleanly (no overlap), for profiling",
    )
    p.add_argument("--burst", help="token bucket size (default: 1 ms of data, >= 64 KB)")
    p.add_argument("--qdisc", default=d["qdisc"], help="htb or tbf")
    p.add_argument("--out", default="results", help="results directory (default ./results; its parent must exist)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a trial is stopped (default 600)")
    p.add_argument("--no-probe", action="store_true", help="skip the iperf3 check before each trial")
    p.add_argument("--probe-duration", type=float, default=1.0, help="seconds of that check (default 1)")
    p.add_argument(
        "--probe-streams", type=int, default=1, help="its TCP streams (default 1; use several at >= 25 Gbit/s)"
    )
    p.add_argument("--runner-module", default="runners.train", help=argparse.SUPPRESS)
    p.add_argument("--overlap", type=_on_off, default=d["overlap"], metavar="on|off",
                   help="on (default): compressor hooks overlap backward; off: hooks block (Agarwal et al.'s serial)")
    p.add_argument("--skew-probe", action="store_true", default=d["skew_probe"],
                   help="record per-collective peer skew (peer_wait_s), apart from comm_s; costs one tiny "
                   "all-gather per collective")
    p.add_argument("--timeline", type=int, dest="timeline_iters", default=d["timeline_iters"], metavar="N",
                   help="keep the marks of the last N measured iterations on every rank (bucket ready, encode, "
                   "wire, decode, waits; `testbed report` draws them; default 0: none)")
    p.add_argument("--trace", type=int, dest="trace_iters", default=d["trace_iters"], metavar="N",
                   help="record N extra iterations with torch.profiler on every rank (Chrome-trace JSON for "
                   "Perfetto/TensorBoard, not measured; default 0: none)")
    g = p.add_argument_group("learning: real data, evaluation, time to accuracy (docs/results-format.md)")
    g.add_argument("--data", default=d["data"], help=f"{catalog.DATA_FORMS} (default synthetic: speed only); each "
                   "rank reads its own seeded shard; the files are checked on every host before any trial")
    g.add_argument("--eval-every", type=int, default=d["eval_every"], metavar="N",
                   help="evaluate on the test split every N steps and after the last (sharded over the ranks; its "
                   "time is kept apart from the training time)")
    g.add_argument("--target-accuracy", type=float, default=d["target_accuracy"], metavar="A",
                   help="stop when the test accuracy reaches A in (0, 1]; needs --eval-every and --max-steps")
    g.add_argument("--max-steps", type=int, default=d["max_steps"], metavar="N",
                   help="training steps in all, warm-up included (default: --warmup-iters + --iters)")
    g.add_argument("--lr", type=float, default=d["lr"], help=f"learning rate (default {RankArgs.lr:g})")
    g = p.add_argument_group("placement and collectives (GPU hosts: NCCL over sockets)")
    g.add_argument("--backend", default=d["backend"],
                   help="auto (default: nccl when every host used has CUDA), nccl, gloo")
    g.add_argument("--ranks-per-host", type=int, help="torchrun's nproc-per-node (default: the hosts' GPUs, else 1)")
    g.add_argument("--intra-host", default=d["intra_host"],
                   help="p2p (default: NVLink/P2P/SHM inside a host) or socket (P2P and SHM off)")
    g.add_argument("--nccl-socket-nthreads", type=int, help="NCCL_SOCKET_NTHREADS (x nsocks-perthread <= 64)")
    g.add_argument("--nccl-nsocks-perthread", type=int, help="NCCL_NSOCKS_PERTHREAD")
    g.add_argument("--nccl-env", action="append", metavar="NCCL_KEY=VAL", help="further NCCL_* setting (repeatable)")
    g.add_argument("--env", action="append", metavar="KEY=VAL",
                   help="a variable every rank gets (repeatable); nothing else of this shell reaches the ranks "
                   "but NCCL_*/GLOO_*/TORCH_*/CUDA_* and OMP/MKL thread counts")  # fmt: skip
    from testbed.plugin_cli import add_plugin_flags

    add_plugin_flags(p)
    metavars = {"int": "N", "float": "X", "bool": "on|off", "choice": "NAME"}
    for key, (flag, kind) in catalog.option_flags().items():
        p.add_argument(flag, dest=f"opt_{key}", type=_FLAG_TYPES[kind], metavar=metavars[kind], help=_option_help(key))


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, f"opt_{k}") for k in OPTION_FLAGS if getattr(args, f"opt_{k}", None) is not None}


def _free_options(args: argparse.Namespace) -> dict[str, Any]:
    """--opt key=value words; a key also given by its own flag (e.g. --rank and --opt rank=...) is refused."""
    from testbed.plugin_cli import parse_opts

    free = parse_opts(getattr(args, "opt", None))
    for key in free:
        if key in _options(args):
            raise InputError(f"--opt {key}=... and {OPTION_FLAGS[key][0]} both given; give one")
    return free


def _plugin_path(args: argparse.Namespace) -> str | None:
    from testbed.plugins import check_plugin_path

    return check_plugin_path(getattr(args, "plugin_path", None))


def _inspect_plugins(trials: list[Trial]) -> dict[tuple, dict[str, Any]]:
    """Every plugin compressor of the trials imported once (in a subprocess) with its options: the plugin's own
    one-line errors are InputErrors here, before any cluster is looked up."""
    from testbed.plugins import inspect_trials

    return inspect_trials(trials)


def _check_plugin_hosts(cluster, trials: list[Trial], infos: dict[tuple, dict[str, Any]]) -> None:
    """Each plugin imports on every host of the cluster, with the plugin path the ranks get (before any trial)."""
    from testbed.plugins import check_hosts

    seen = set()
    for key, info in infos.items():
        spec, _, path = key
        if (spec, path) not in seen:
            seen.add((spec, path))
            check_hosts(cluster, cluster.hosts(), spec, path, info.get("sha256"))


def _check_data_hosts(cluster, trials: list[Trial]) -> None:
    """--data is on every host the cluster has, in the expected layout (before any trial; exit 2 naming the host)."""
    from testbed.datasets import check_hosts

    check_hosts(cluster, cluster.hosts(), trials)


def _located_plugin(trial: Trial) -> dict[str, Any] | None:
    """A plugin's module, file and sha256 found without importing it (what `--dry-run` shows)."""
    from testbed.plugins import locate

    return locate(trial.compressor, trial.plugin_path) if catalog.is_plugin_spec(trial.compressor) else None


def _plugin_of(trial: Trial, infos: dict[tuple, dict[str, Any]]) -> dict[str, Any] | None:
    return infos.get((trial.compressor, trial.options, trial.plugin_path))


def _common(args: argparse.Namespace) -> dict[str, Any]:
    from shaping.units import parse_size_bytes

    def value(key: str) -> Any:
        v = getattr(args, key)
        return TRIAL_FLAG_DEFAULTS[key] if v is None else v

    burst = value("burst")
    return dict(
        model=value("model"),
        batch_size=value("batch_size"),
        iters=value("iters"),
        warmup_iters=value("warmup_iters"),
        seed=value("seed"),
        image_size=value("image_size"),
        seq_len=value("seq_len"),
        bucket_cap_mb=value("bucket_cap_mb"),
        serial=value("serial"),
        overlap=value("overlap"),
        skew_probe=value("skew_probe"),
        timeline_iters=value("timeline_iters"),
        trace_iters=value("trace_iters"),
        backend=value("backend"),
        ranks_per_host=value("ranks_per_host"),
        intra_host=value("intra_host"),
        nccl_socket_nthreads=value("nccl_socket_nthreads"),
        nccl_nsocks_perthread=value("nccl_nsocks_perthread"),
        nccl_env=parse_env_pairs(value("nccl_env"), "--nccl-env"),
        qdisc=value("qdisc"),
        cluster=args.name,
        runner=args.runner_module,
        burst_bytes=parse_size_bytes(burst, "--burst") if burst is not None else None,
        **{key: value(key) for key in LEARNING_DEFAULTS},
        **trial_shape.from_args(args),
    )


def _netem_probe(cluster):
    """The local cluster's netem probe (its hosts share this kernel); other backends' host tool checks it itself."""
    if cluster.backend != "local":
        return None
    from testbed.cluster.topology import netem_available

    return netem_available


def _check_timeout(timeout_s: float) -> float:
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise InputError(f"--timeout {timeout_s:g}: expected seconds in (0, {MAX_TIMEOUT_S:g}] (a trial's time limit)")
    return timeout_s


def _cluster_for(args: argparse.Namespace, world_size: int):
    """The named cluster, which must be up: `run` and `sweep` never bring one up (nothing would take it down)."""
    if registry.load_record(args.name) is None:
        up = ", ".join(registry.recorded_names()) or "none"
        raise InputError(
            f"no cluster named {args.name!r} is up (clusters up: {up}); bring one up first: "
            f"`testbed up --name {args.name} --hosts {max(world_size, 2)}`"
        )
    return backends.open_cluster(args.name)


def wait_seconds(args: argparse.Namespace) -> float:
    """--wait: how long to wait for a cluster another command holds (0: refuse at once, naming it)."""
    wait = getattr(args, "wait", 0.0) or 0.0
    if not (math.isfinite(wait) and 0 <= wait <= MAX_TIMEOUT_S):
        raise InputError(f"--wait {wait:g}: expected seconds in [0, {MAX_TIMEOUT_S:g}] (0 refuses at once when the "
                         "cluster is in use)")
    return wait


def add_wait_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="when another command holds the cluster (one at a time per cluster), wait up to SECONDS for "
                   "it (default 0: refuse at once, naming its pid and command)")


def _open_store(path: str):
    """The results store of --out, checked writable before anything starts."""
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    store = ResultsStore(path)
    store.check_writable()
    return store


def _probe_args(args: argparse.Namespace) -> dict[str, Any]:
    """The per-trial probe's duration and streams, checked (exit 2) before anything starts."""
    from testbed.probe import check_probe_args

    check_probe_args(args.probe_duration, args.probe_streams, flag_prefix="--probe-")
    return {"probe_duration_s": args.probe_duration, "probe_streams": args.probe_streams}


# ---------------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from testbed import launch_plan
    from testbed.cluster_lease import hold
    from testbed.launch import STOP, make_plan, run_trial, stop_exit_code, stop_on_signals

    if not args.bw:
        raise InputError("run needs --bw RATE (e.g. 500mbit), or --bw none for an unshaped run")
    from testbed.plugins import resolve_name

    rate = parse_rates([args.bw])[0]
    opts = {**_options(args), **_free_options(args)}
    _check_timeout(args.timeout)
    wait_seconds(args)
    _probe_args(args)  # the per-trial probe's settings, checked before anything starts
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    trial = Trial(
        compressor=resolve_name(args.compressor),
        rate_bps=rate,
        world_size=args.world_size or (args.ranks_per_host or 1),  # placeholder until resolved against the hosts
        options=tuple(sorted(opts.items())),
        plugin_path=_plugin_path(args),
        **_common(args),
    )
    store = _open_store(args.out)  # checked writable before anything is looked up or started
    infos = {} if args.dry_run else _inspect_plugins([trial])  # --dry-run never imports (runs) a plugin
    cluster = _cluster_for(args, trial.world_size)
    # backend, ranks per host and world size made concrete for this cluster's hosts (exit 2 if they cannot run it)
    trial = launch_plan.resolve(trial, cluster.hosts(), world_size_given=args.world_size is not None)
    trial_shape.check_on_cluster([trial], cluster, _netem_probe(cluster))  # --host-bw hosts, netem: exit 2
    if args.dry_run:  # what would start: nothing is shaped, started or stored
        from pathlib import Path

        out = Path(args.out) / "trials" / trial.trial_id
        plan = make_plan(cluster, trial, cluster.rank_out_dir(out, trial.trial_id), timeout_s=args.timeout,
                         user_env=user_env)  # fmt: skip
        print_json({"trial_id": trial.trial_id, "trial": trial.config(), "plugin": _located_plugin(trial),
                    "plan": plan.to_json()})  # fmt: skip
        return 0
    stored = store.find(trial.trial_id)
    if stored is not None and stored["status"] == "ok" and not args.rerun:
        raise InputError(
            f"trial {trial.trial_id} is already stored ok in {store.root} (attempt {stored['attempt']}, "
            f"{stored['started_at']}); add --rerun to measure it again as a new attempt (the stored one is kept)"
        )
    _check_plugin_hosts(cluster, [trial], infos)
    _check_data_hosts(cluster, [trial])
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
                **_probe_args(args),
                plugin=_plugin_of(trial, infos),
            )
    baseline = store.find(trial.baseline().trial_id) if trial.compressor != "syncsgd" else None
    if args.json:
        print_json({"trial": trial.config(), "row": row, "baseline_row": baseline})
    else:
        print_run_summary(trial, row, baseline)
    if STOP.is_set():
        return stop_exit_code()
    return 0 if row["status"] == "ok" else 1


UNSTEADY_RATIO = 1.10  # a trial whose first two measured steps took this much longer than its last two


def unsteady_note(row: dict[str, Any]) -> str | None:
    """A one-line warning when the trial's steps were still getting faster while measured (`settle_ratio`), else
    None: its mean and p50 overstate the steady step (4 ranks on 2 cores, Sign-SGD after 2 warm-up steps: 1.43x)."""
    ratio = row.get("settle_ratio")
    if row.get("status") != "ok" or ratio is None or ratio <= UNSTEADY_RATIO:
        return None
    return (f"warning: trial {row['trial_id']} was still warming up: its first two measured steps took "
            f"{ratio:.2f}x its last two; measure it again with a larger --warmup-iters (was {row['warmup_iters']})")


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
    note = unsteady_note(row)
    if note:
        console.print(f"[yellow]{note}[/]", markup=True)


# ---------------------------------------------------------------------------------------------------- sweep
def _sweep_trials(args: argparse.Namespace) -> list[Trial]:
    """The grid from --config or from the flags; every value checked (Trial) before anything starts."""
    if args.config:
        given = [f"--{k.replace('_', '-')}" for k in ("bw", "compressor", "world_size") if getattr(args, k)]
        given += [f"--{k.replace('_', '-')}" for k in TRIAL_FLAG_DEFAULTS
                  if k not in OBSERVATION_FIELDS and getattr(args, k) is not None]  # fmt: skip
        given += [OPTION_FLAGS[k][0] for k in _options(args)]
        given += [f for f, v in (("--opt", args.opt), ("--plugin-path", args.plugin_path)) if v is not None]
        given += trial_shape.given_flags(args)
        if given:
            raise InputError(
                f"{', '.join(given)} with --config: the sweep file sets the grid and the trial settings, so the "
                f"flag{'s' if len(given) > 1 else ''} would be ignored; put the value{'s' if len(given) > 1 else ''} "
                f"in {args.config} or drop --config"
            )
        trials = load_sweep_toml(args.config, cluster=args.name, runner=args.runner_module)
        # --timeline/--trace observe a sweep file's trials without changing them (not part of the trial id)
        observe = {k: getattr(args, k) for k in OBSERVATION_FIELDS if getattr(args, k) is not None}
        if observe:
            import dataclasses

            trials = [dataclasses.replace(t, **observe) for t in trials]
        return _with_seeds(args, trial_shape.stragglers_from_args(args, trials))
    if not (args.bw is not None and args.compressor is not None and args.world_size is not None):
        raise InputError("sweep needs --config FILE, or --bw, --compressor and --world-size lists")
    try:
        sizes = [int(x) for x in parse_list(args.world_size, "--world-size")]
    except ValueError:
        raise InputError(f"--world-size {args.world_size!r}: expected comma-separated integers") from None
    from testbed.plugins import resolve_name

    compressors = [resolve_name(c) for c in parse_list(args.compressor, "--compressor")]
    flag_opts = _options(args)
    free_opts = _free_options(args)
    plugins_in_grid = [c for c in compressors if catalog.is_plugin_spec(c)]
    for key in flag_opts:  # an option goes to the compressors of the grid that take it; one nobody takes is refused
        if not any(key in catalog.options_of(c) for c in compressors if c in catalog.COMPRESSORS):
            users = ", ".join(catalog.who_accepts(key))
            raise InputError(
                f"{OPTION_FLAGS[key][0]} applies to no compressor in --compressor {args.compressor} "
                f"({key} is for {users})"
            )
    for key in free_opts:  # --opt goes to every plugin of the grid and to the built-ins that take the option
        if not plugins_in_grid and not any(key in catalog.options_of(c) for c in compressors if c in catalog.COMPRESSORS):
            raise InputError(f"--opt {key}=...: applies to no compressor in --compressor {args.compressor}")
    options = {
        c: {k: v for k, v in {**flag_opts, **free_opts}.items() if k in catalog.options_of(c)}
        for c in compressors
        if c in catalog.COMPRESSORS
    }
    options.update({c: dict(free_opts) for c in plugins_in_grid})
    plugin_path = _plugin_path(args)
    if plugin_path is not None and not plugins_in_grid:
        raise InputError(f"--plugin-path applies to MODULE:FACTORY compressors; --compressor {args.compressor} has none")
    grid = expand(parse_rates(parse_list(args.bw, "--bw")), compressors, sizes, options=options,
                  plugin_path=plugin_path, **_common(args))  # fmt: skip
    return _with_seeds(args, trial_shape.stragglers_from_args(args, grid))


def _with_seeds(args: argparse.Namespace, trials: list[Trial]) -> list[Trial]:
    """--seeds K: every trial of the grid with seeds S, S+1, ..., S+K-1 (S: its --seed), e.g. one convergence run per
    compressor and seed (time to accuracy, testbed/accuracy.py)."""
    import dataclasses

    k = getattr(args, "seeds", None)
    if k is None:
        return trials
    if isinstance(k, bool) or k < 1:
        raise InputError(f"--seeds {k}: expected an integer >= 1 (how many seeds per configuration)")
    return list(dict.fromkeys(dataclasses.replace(t, seed=t.seed + i) for t in trials for i in range(k)))


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

    _check_timeout(args.timeout)
    wait_seconds(args)
    _probe_args(args)  # the per-trial probe's settings, checked before anything starts
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    trials = _sweep_trials(args)
    infos = _inspect_plugins(trials)
    store = _open_store(args.out)
    if registry.load_record(args.name) is None and len(trials) > CONFIRM_GRID_ABOVE and not args.yes:
        _refuse_big_grid(len(trials), _eta_text(store, len(trials), args.timeout))  # said before "no cluster"
    cluster = _cluster_for(args, max(t.world_size for t in trials))
    hosts = cluster.hosts()
    # concrete backend and ranks per host for these hosts (their trial ids are what the store holds); every trial
    # of the grid must fit before the first one starts
    trials = list(dict.fromkeys(launch_plan.resolve(t, hosts) for t in trials))
    trial_shape.check_on_cluster(trials, cluster, _netem_probe(cluster))  # --host-bw hosts, netem: exit 2
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
    _check_plugin_hosts(cluster, todo, infos)
    _check_data_hosts(cluster, todo)
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
                            **_probe_args(args), plugin=_plugin_of(trial, infos))  # fmt: skip
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
            elif note := unsteady_note(row):
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
