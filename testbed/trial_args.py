"""From `run`/`sweep`/`crossover` flags to trials: the trial flags (one definition for every command that runs
trials), the compressor options they carry, the checks made before anything starts (plugins and data on every host,
timeouts, the probe's flags, the results store), the grid a sweep expands and its seeds, and the cluster the trials
run on. Library code: it parses and checks, never prints; the command modules (run_cli, crossover_cli) print."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from runners import catalog
from runners.contract import TRAINING_DEFAULTS, RankArgs
from testbed import trial_shape
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


def parse_opts(items: list[str] | None, flag: str = "--opt") -> dict[str, Any]:
    """`--opt key=value` words (repeatable) -> {key: value}; values read as JSON (numbers, true/false), else text."""
    from runners.contract import parse_value

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} ratio=0.05")
        if key in out:
            raise InputError(f"{flag} {key} given twice")
        out[key] = parse_value(value)
    return out


def add_plugin_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--opt", action="append", metavar="KEY=VALUE",
                   help="a compressor option (repeatable), e.g. --opt ratio=0.05; a plugin checks its own")  # fmt: skip
    p.add_argument("--plugin-path", metavar="DIR",
                   help="directory of a MODULE:FACTORY plugin: recorded with the trial and given to every rank as "
                   "its PYTHONPATH (nothing else of this shell's environment reaches a rank). A plugin is code: "
                   "in local mode it runs as root (checks and ranks); name only a directory only you can write")  # fmt: skip


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
    p.add_argument("--burst", help="token bucket size (default: 1 ms of data, at least two frames)")
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
    add_plugin_flags(p)
    metavars = {"int": "N", "float": "X", "bool": "on|off", "choice": "NAME"}
    for key, (flag, kind) in catalog.option_flags().items():
        p.add_argument(flag, dest=f"opt_{key}", type=_FLAG_TYPES[kind], metavar=metavars[kind], help=_option_help(key))


def compressor_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, f"opt_{k}") for k in OPTION_FLAGS if getattr(args, f"opt_{k}", None) is not None}


def free_options(args: argparse.Namespace) -> dict[str, Any]:
    """--opt key=value words; a key also given by its own flag (e.g. --rank and --opt rank=...) is refused."""
    free = parse_opts(getattr(args, "opt", None))
    for key in free:
        if key in compressor_options(args):
            raise InputError(f"--opt {key}=... and {OPTION_FLAGS[key][0]} both given; give one")
    return free


def checked_plugin_path(args: argparse.Namespace) -> str | None:
    from testbed.plugins import check_plugin_path

    return check_plugin_path(getattr(args, "plugin_path", None))


def inspect_plugins(trials: list[Trial]) -> dict[tuple, dict[str, Any]]:
    """Every plugin compressor of the trials imported once (in a subprocess) with its options: the plugin's own
    one-line errors are InputErrors here, before any cluster is looked up."""
    from testbed.plugins import inspect_trials

    return inspect_trials(trials)


def check_plugin_hosts(cluster, trials: list[Trial], infos: dict[tuple, dict[str, Any]]) -> None:
    """Each plugin imports on every host of the cluster, with the plugin path the ranks get (before any trial)."""
    from testbed.plugins import check_hosts

    seen = set()
    for key, info in infos.items():
        spec, _, path = key
        if (spec, path) not in seen:
            seen.add((spec, path))
            check_hosts(cluster, cluster.hosts(), spec, path, info.get("sha256"))


def check_data_hosts(cluster, trials: list[Trial]) -> None:
    """--data is on every host the cluster has, in the expected layout (before any trial; exit 2 naming the host)."""
    from testbed.datasets import check_hosts

    check_hosts(cluster, cluster.hosts(), trials)


def located_plugin(trial: Trial) -> dict[str, Any] | None:
    """A plugin's module, file and sha256 found without importing it (what `--dry-run` shows)."""
    from testbed.plugins import locate

    return locate(trial.compressor, trial.plugin_path) if catalog.is_plugin_spec(trial.compressor) else None


def plugin_of(trial: Trial, infos: dict[tuple, dict[str, Any]]) -> dict[str, Any] | None:
    return infos.get((trial.compressor, trial.options, trial.plugin_path))


def common_fields(args: argparse.Namespace) -> dict[str, Any]:
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


def netem_probe(cluster):
    """The local cluster's netem probe (its hosts share this kernel); other backends' host tool checks it itself."""
    if cluster.backend != "local":
        return None
    from testbed.cluster.topology import netem_available

    return netem_available


def check_timeout(timeout_s: float) -> float:
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise InputError(f"--timeout {timeout_s:g}: expected seconds in (0, {MAX_TIMEOUT_S:g}] (a trial's time limit)")
    return timeout_s


def cluster_for(args: argparse.Namespace, world_size: int):
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


def open_store(path: str):
    """The results store of --out, checked writable before anything starts."""
    from testbed.results import ResultsStore  # pandas/pyarrow: imported only by the commands that use them

    store = ResultsStore(path)
    store.check_writable()
    return store


def probe_args(args: argparse.Namespace) -> dict[str, Any]:
    """The per-trial probe's duration and streams, checked (exit 2) before anything starts."""
    from testbed.probe import check_probe_args

    check_probe_args(args.probe_duration, args.probe_streams, flag_prefix="--probe-")
    return {"probe_duration_s": args.probe_duration, "probe_streams": args.probe_streams}



def sweep_trials(args: argparse.Namespace) -> list[Trial]:
    """The grid from --config or from the flags; every value checked (Trial) before anything starts."""
    if args.config:
        given = [f"--{k.replace('_', '-')}" for k in ("bw", "compressor", "world_size") if getattr(args, k)]
        given += [f"--{k.replace('_', '-')}" for k in TRIAL_FLAG_DEFAULTS
                  if k not in OBSERVATION_FIELDS and getattr(args, k) is not None]  # fmt: skip
        given += [OPTION_FLAGS[k][0] for k in compressor_options(args)]
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
        return with_seeds(args, trial_shape.stragglers_from_args(args, trials))
    if not (args.bw is not None and args.compressor is not None and args.world_size is not None):
        raise InputError("sweep needs --config FILE, or --bw, --compressor and --world-size lists")
    try:
        sizes = [int(x) for x in parse_list(args.world_size, "--world-size")]
    except ValueError:
        raise InputError(f"--world-size {args.world_size!r}: expected comma-separated integers") from None
    from testbed.plugins import resolve_name

    compressors = [resolve_name(c) for c in parse_list(args.compressor, "--compressor")]
    flag_opts = compressor_options(args)
    free_opts = free_options(args)
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
    plugin_path = checked_plugin_path(args)
    if plugin_path is not None and not plugins_in_grid:
        raise InputError(f"--plugin-path applies to MODULE:FACTORY compressors; --compressor {args.compressor} has none")
    grid = expand(parse_rates(parse_list(args.bw, "--bw")), compressors, sizes, options=options,
                  plugin_path=plugin_path, **common_fields(args))  # fmt: skip
    return with_seeds(args, trial_shape.stragglers_from_args(args, grid))


def with_seeds(args: argparse.Namespace, trials: list[Trial]) -> list[Trial]:
    """--seeds K: every trial of the grid with seeds S, S+1, ..., S+K-1 (S: its --seed), e.g. one convergence run per
    compressor and seed (time to accuracy, testbed/accuracy.py)."""
    import dataclasses

    k = getattr(args, "seeds", None)
    if k is None:
        return trials
    if isinstance(k, bool) or k < 1:
        raise InputError(f"--seeds {k}: expected an integer >= 1 (how many seeds per configuration)")
    return list(dict.fromkeys(dataclasses.replace(t, seed=t.seed + i) for t in trials for i in range(k)))
