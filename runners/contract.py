"""The launcher <-> rank contract, in one place: the rank's command line, its torchrun environment, its summary.

Torch-free on purpose: the controller (testbed/launch.py) builds a rank's argv with ``RankArgs.to_argv()`` and its
environment with ``torchrun_env()``; the rank (runners/train.py) parses the same argv with ``RankArgs.from_argv()`` and
reads the same variables with ``RankEnv.from_environ()``. ``SUMMARY_METRICS`` are the keys rank 0 writes to
``summary.json`` and the launcher copies into the results row. A flag added here exists on both sides at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from runners import catalog

BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass(frozen=True)
class TrainingDefaults:
    """The one home of a training run's defaults: RankArgs below, testbed.config.Trial, `testbed run`'s flags and
    the sweep file loader (through Trial) read them, and the docs quote them."""

    model: str = "resnet18"
    batch_size: int = 32  # samples per rank per iteration
    iters: int = 20  # measured iterations
    warmup_iters: int = 5  # unrecorded iterations before them (raised to the compressor's need)
    seed: int = 0
    image_size: int = catalog.DEFAULT_IMAGE_SIZE
    seq_len: int = catalog.DEFAULT_SEQ_LEN
    bucket_cap_mb: float = 25.0  # DDP's bucket cap


TRAINING_DEFAULTS = TrainingDefaults()

# Keys of summary.json that become results columns (the launcher refuses a summary that lacks one).
SUMMARY_METRICS = (
    "iter_time_s_mean",
    "iter_time_s_p5",
    "iter_time_s_p50",
    "iter_time_s_p95",
    "samples_per_s",
    "forward_s",
    "backward_s",
    "encode_s",
    "comm_s",
    "decode_s",
    "optimizer_s",
    "payload_bytes_per_iter",
    "wire_tx_bytes_per_iter",
    "wire_rx_bytes_per_iter",
    "peer_wait_s",  # null unless --skew-probe
    # the overlap split (runners/timeline.py): comm columns null for built-in syncsgd, all null with --no-timing
    "comm_wire_s",
    "comm_hidden_s",
    "comm_exposed_s",
    "codec_critical_s",
    "codec_hidden_s",
)

# What summary.json's "env" says about the software and hardware a trial ran on (results columns of the same name).
SUMMARY_ENV_KEYS = (
    "torch_version",
    "backend",
    "device",
    "device_name",
    "cuda_version",
    "nccl_version",
    "driver_version",
)


# Keys of summary.json about learning (--data, --eval-every, --target-accuracy): results columns of the same name,
# null for a synthetic trial without evaluation (the launcher copies them when present).
SUMMARY_ACCURACY = (
    "data",
    "steps_run",
    "train_time_s",
    "eval_time_s",
    "eval_samples",
    "final_test_loss",
    "final_test_accuracy",
    "reached_target",
    "steps_to_target",
    "train_time_to_target_s",
    "curve",
)

FLAG_FIELDS = ("serial", "skew_probe", "no_timing")  # switches present or absent on the command line


class ContractError(ValueError):
    """A command line or environment that does not follow the contract: one line, the rank exits 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise ContractError(message)


def _on_off(text: str) -> bool:
    if text in ("on", "off"):
        return text == "on"
    raise argparse.ArgumentTypeError(f"{text!r}: expected on or off")


def parse_value(text: str) -> Any:
    """An option value as typed on the command line: JSON (numbers, true/false, quoted strings), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        return text


@dataclasses.dataclass(frozen=True)
class RankArgs:
    """Everything a rank is told on its command line. Field names are the flags (``bucket_cap_mb`` ->
    ``--bucket-cap-mb``); ``overlap`` is on|off, the other booleans are switches (FLAG_FIELDS, present or absent)."""

    model: str
    out: str
    compressor: str = "syncsgd"
    options: tuple[tuple[str, Any], ...] = ()  # compressor options, (key, value) pairs: --opt key=value
    batch_size: int = TRAINING_DEFAULTS.batch_size
    image_size: int = TRAINING_DEFAULTS.image_size
    seq_len: int = TRAINING_DEFAULTS.seq_len
    iters: int = TRAINING_DEFAULTS.iters
    warmup_iters: int = TRAINING_DEFAULTS.warmup_iters
    seed: int = TRAINING_DEFAULTS.seed
    lr: float = 0.01
    backend: str = "auto"  # auto | gloo | nccl
    iface: str | None = None
    timeout_s: float = 120.0
    bucket_cap_mb: float = TRAINING_DEFAULTS.bucket_cap_mb
    serial: bool = False
    overlap: bool = True
    skew_probe: bool = False
    no_timing: bool = False
    threads: int = 0
    timeline_iters: int = 0  # keep the marks of the last N measured iterations (timeline_rank<r>.json)
    trace_iters: int = 0  # N extra iterations under torch.profiler between warm-up and the measured ones
    data: str = "synthetic"  # runners.catalog.DATASETS: synthetic | fashion-mnist | cifar10:DIR | imagefolder:DIR
    eval_every: int | None = None  # evaluate on the test split every N steps (and after the last)
    target_accuracy: float | None = None  # stop once the test accuracy reaches it
    max_steps: int | None = None  # training steps in all (warm-up included) instead of warmup + iters

    HELP = {
        "model": "model name (runners.models.MODELS)",
        "out": "output directory",
        "compressor": "compressor name (runners.compressors.names())",
        "batch_size": "samples per rank per iteration",
        "iters": "measured iterations",
        "warmup_iters": "unrecorded iterations (raised to the compressor's need; serial mode needs >= 2)",
        "backend": "auto (nccl when CUDA is visible), gloo or nccl",
        "iface": "data interface: sets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; its counters give wire bytes "
        "(default: the interface that routes to MASTER_ADDR)",
        "timeout_s": "collective timeout",
        "serial": "no overlap: no_sync backward, then reduce the buckets",
        "overlap": "on: hooks return un-waited futures (communication overlaps backward); off: hooks block",
        "skew_probe": "measure peer skew per collective (peer_wait_s): one extra tiny all-gather per collective, "
        "on its own process group",
        "no_timing": "per-phase timers off (phases recorded as null)",
        "threads": "torch intra-op threads (0: torch's default)",
        "timeline_iters": "keep the marks of the last N measured iterations (timeline_rank<r>.json; 0: none)",
        "trace_iters": "record N extra iterations with torch.profiler (trace_rank<r>.json, Chrome trace; 0: none)",
        "data": "synthetic, fashion-mnist, cifar10:DIR or imagefolder:DIR (runners/data.py: seeded shards)",
        "eval_every": "evaluate on the test split (sharded, summed) every N steps and after the last",
        "target_accuracy": "stop when the test accuracy reaches this fraction (0, 1]",
        "max_steps": "training steps in all, warm-up included (default: warmup + iters)",
    }

    @property
    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    # ------------------------------------------------------------------------------------------ argv, both ways
    def to_argv(self) -> list[str]:
        """The flags for ``python -m runners.train`` (without the interpreter and module)."""
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if f.name == "options":
                for key, v in value:
                    argv += ["--opt", f"{key}={json.dumps(v)}"]
            elif f.name in FLAG_FIELDS:
                if value:
                    argv.append(flag)
            elif f.name == "overlap":
                argv += [flag, "on" if value else "off"]
            elif value is not None:
                argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return argv

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        p = _Parser(prog="train", description="One rank of a DDP training run with a gradient compressor.")
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            helptext = cls.HELP.get(f.name)
            if f.name == "options":
                p.add_argument("--opt", dest="options", action="append", default=[], metavar="KEY=VALUE",
                               help="compressor option (repeatable), e.g. --opt rank=4 --opt ratio=0.01")  # fmt: skip
            elif f.name in FLAG_FIELDS:
                p.add_argument(flag, action="store_true", help=helptext)
            elif f.name == "overlap":
                p.add_argument(flag, type=_on_off, default=True, metavar="on|off", help=helptext)
            elif f.name == "backend":
                p.add_argument(flag, choices=("auto", *BACKENDS), default=f.default, help=helptext)
            else:
                kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
                required = f.default is dataclasses.MISSING
                p.add_argument(flag, type=kind, required=required, default=None if required else f.default,
                               help=helptext)  # fmt: skip
        return p

    @classmethod
    def from_argv(cls, argv: list[str]) -> RankArgs:
        """Parse and check what needs no torch; raises ContractError with one line."""
        ns = vars(cls.parser().parse_args(argv))
        options = []
        for item in ns.pop("options"):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ContractError(f"--opt {item!r} is not KEY=VALUE")
            options.append((key, parse_value(value)))
        args = cls(options=tuple(options), **ns)
        args.check()
        return args

    def check(self) -> None:
        for flag, value, lo in (("--batch-size", self.batch_size, 1), ("--iters", self.iters, 1),
                                ("--warmup-iters", self.warmup_iters, 0), ("--image-size", self.image_size, 8),
                                ("--seq-len", self.seq_len, 1), ("--threads", self.threads, 0),
                                ("--timeline-iters", self.timeline_iters, 0),
                                ("--trace-iters", self.trace_iters, 0)):  # fmt: skip
            if value < lo:
                raise ContractError(f"{flag} {value} is not accepted: expected >= {lo}")
        if self.timeline_iters > self.iters:
            raise ContractError(
                f"--timeline-iters {self.timeline_iters} is not accepted: expected 0 to --iters ({self.iters})"
            )
        if self.timeline_iters and self.no_timing:
            raise ContractError("--timeline-iters needs the phase timers: drop --no-timing")
        if self.seq_len > 512:
            raise ContractError(f"--seq-len {self.seq_len} is not accepted: BERT-base has 512 positions")
        for flag, value in (("--timeout-s", self.timeout_s), ("--bucket-cap-mb", self.bucket_cap_mb),
                            ("--lr", self.lr)):  # fmt: skip
            if not (value > 0 and math.isfinite(value)):
                raise ContractError(f"{flag} {value} is not accepted: expected a finite number > 0")
        for flag, value in (("--eval-every", self.eval_every), ("--max-steps", self.max_steps)):
            if value is not None and value < 1:
                raise ContractError(f"{flag} {value} is not accepted: expected >= 1")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ContractError(f"--target-accuracy {self.target_accuracy} is not accepted: expected (0, 1]")
        if self.target_accuracy is not None and (self.eval_every is None or self.max_steps is None):
            raise ContractError("--target-accuracy needs --eval-every and --max-steps")


# ------------------------------------------------------------------------------------------------ environment
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    group_rank: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The variables torchrun gives each worker (RANK ... MASTER_PORT), so every launcher starts a rank alike."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(group_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """A rank's place in the job, read from the torchrun environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv:
        missing = [k for k in REQUIRED_ENV if not environ.get(k)]
        if missing:
            raise ContractError(f"missing environment variable(s) {', '.join(missing)} (start me with torchrun)")
        values: dict[str, int] = {}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
            try:
                values[key] = int(environ[key])
            except ValueError:
                raise ContractError(f"{key}={environ[key]!r} is not an integer") from None
        world, rank = values["WORLD_SIZE"], values["RANK"]
        if world < 1 or not 0 <= rank < world:
            raise ContractError(f"RANK={rank} WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
        try:
            local_world = int(environ.get("LOCAL_WORLD_SIZE") or 1)
            group_rank = int(environ.get("GROUP_RANK") or rank)
        except ValueError:
            raise ContractError("LOCAL_WORLD_SIZE and GROUP_RANK must be integers") from None
        if not 0 <= values["LOCAL_RANK"] < max(local_world, values["LOCAL_RANK"] + 1):
            raise ContractError(f"LOCAL_RANK={values['LOCAL_RANK']}: expected >= 0")
        return cls(rank, world, values["LOCAL_RANK"], local_world, group_rank, environ["MASTER_ADDR"],
                   values["MASTER_PORT"])  # fmt: skip


# ------------------------------------------------------------------------------------------------ collective benchmark
COLLBENCH_SCHEMA = "testbed.collbench/1"
# seconds of training steps per contention measurement (alone, then beside a stream of each collective at the smallest
# and the largest size, per rep): most of a calibration's time at small sizes
DEFAULT_PROBE_S = 2.0
MAX_PROBE_S = 60.0


@dataclasses.dataclass(frozen=True)
class CollBenchArgs:
    """The command line of ``python -m runners.collbench`` (one rank of `testbed calibrate`), built by the
    controller (testbed/calibrate.py) and parsed by the rank, like ``RankArgs``.

    ``sizes_bytes`` are message sizes in nccl-tests' convention: the all-reduce buffer, and the all-gather's *output*
    (each rank contributes size / world size). Rank 0 writes ``out`` (JSON, schema ``COLLBENCH_SCHEMA``)."""

    out: str
    sizes_bytes: tuple[int, ...] = (65536, 1048576)
    reps: int = 5
    warmup: int = 1
    backend: str = "gloo"
    iface: str | None = None
    timeout_s: float = 120.0
    threads: int = 0
    probe_s: float = DEFAULT_PROBE_S

    def to_argv(self) -> list[str]:
        argv = ["--out", self.out, "--sizes-bytes", ",".join(str(s) for s in self.sizes_bytes), "--reps",
                str(self.reps), "--warmup", str(self.warmup), "--backend", self.backend, "--timeout-s",
                f"{self.timeout_s:g}", "--threads", str(self.threads), "--probe-s", f"{self.probe_s:g}"]  # fmt: skip
        if self.iface:
            argv += ["--iface", self.iface]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> CollBenchArgs:
        p = _Parser(prog="collbench", description="One rank of the all-reduce / all-gather microbenchmark.")
        p.add_argument("--out", required=True, help="JSON file rank 0 writes")
        p.add_argument("--sizes-bytes", required=True, help="comma-separated message sizes in bytes")
        p.add_argument("--reps", type=int, default=5, help="timed repetitions per size and collective")
        p.add_argument("--warmup", type=int, default=1, help="untimed repetitions per size and collective")
        p.add_argument("--backend", choices=BACKENDS, default="gloo")
        p.add_argument("--iface", help="data interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)")
        p.add_argument("--timeout-s", type=float, default=120.0, help="collective timeout")
        p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
        p.add_argument("--probe-s", type=float, default=DEFAULT_PROBE_S,
                       help="seconds of training steps per contention measurement")  # fmt: skip
        ns = p.parse_args(argv)
        try:
            sizes = tuple(int(s) for s in ns.sizes_bytes.split(",") if s.strip())
        except ValueError:
            raise ContractError(f"--sizes-bytes {ns.sizes_bytes!r}: expected comma-separated integers") from None
        args = cls(ns.out, sizes, ns.reps, ns.warmup, ns.backend, ns.iface, ns.timeout_s, ns.threads, ns.probe_s)
        if not sizes or min(sizes) < 4:
            raise ContractError(f"--sizes-bytes {ns.sizes_bytes!r}: expected sizes >= 4 bytes")
        if args.reps < 1 or args.warmup < 0 or args.threads < 0:
            raise ContractError("--reps must be >= 1, --warmup and --threads >= 0")
        if not (args.timeout_s > 0 and math.isfinite(args.timeout_s)):
            raise ContractError(f"--timeout-s {args.timeout_s}: expected a finite number > 0")
        if not 0 < args.probe_s <= MAX_PROBE_S:
            raise ContractError(f"--probe-s {args.probe_s}: expected seconds in (0, {MAX_PROBE_S:g}]")
        return args


@dataclasses.dataclass(frozen=True)
class ProfileArgs:
    """The command line of ``python -m runners.profile`` (one process of `testbed profile`; with ``lockstep_rank``
    one of the ``--colocated`` processes on a file-store gloo group), built by the controller (testbed/modelling.py)
    and parsed by the process, like ``RankArgs``. ``options`` are the compressors' options by name; ``opt`` adds
    ``NAME.KEY=VALUE`` items typed by hand (``--opt powersgd.rank=4``)."""

    model: str
    batch_size: int
    out: str
    compressors: tuple[str, ...] = ("syncsgd",)
    options: Mapping[str, Mapping[str, Any]] | None = None
    iters: int = 5
    bucket_cap_mb: float = 25.0
    threads: int = 0
    device: str = "cpu"
    image_size: int | None = None  # None: the catalogue's default
    seq_len: int | None = None
    lockstep_rank: int | None = None
    lockstep_world: int = 0
    init_method: str = ""
    lockstep_codecs_only: bool = False  # the compressors in place alone, no compute (testbed.modelling.measure_lockstep)

    def to_argv(self) -> list[str]:
        argv = ["--model", self.model, "--batch-size", str(self.batch_size), "--compressors", ",".join(self.compressors),
                "--iters", str(self.iters), "--bucket-cap-mb", str(self.bucket_cap_mb), "--threads", str(self.threads),
                "--device", self.device]  # fmt: skip
        if self.lockstep_world:
            argv += ["--lockstep-world", str(self.lockstep_world), "--init-method", self.init_method]
        argv += ["--out", self.out]
        if self.image_size:
            argv += ["--image-size", str(self.image_size)]
        if self.seq_len:
            argv += ["--seq-len", str(self.seq_len)]
        if self.options:
            argv += ["--options-json", json.dumps(self.options)]
        if self.lockstep_rank is not None:
            argv += ["--lockstep-rank", str(self.lockstep_rank)]
        if self.lockstep_codecs_only:
            argv += ["--lockstep-codecs-only"]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> ProfileArgs:
        """Parse; raises ContractError with one line (the process exits 2)."""
        p = _Parser(prog="profile", description="Profile a model and compressors on one rank.")
        p.add_argument("--model", required=True)
        p.add_argument("--batch-size", type=int, required=True)
        p.add_argument("--compressors", default="syncsgd", help="comma-separated names")
        p.add_argument("--opt", action="append", default=[], metavar="NAME.KEY=VALUE",
                       help="compressor option, e.g. --opt powersgd.rank=4")  # fmt: skip
        p.add_argument("--image-size", type=int, default=catalog.DEFAULT_IMAGE_SIZE)
        p.add_argument("--seq-len", type=int, default=catalog.DEFAULT_SEQ_LEN)
        p.add_argument("--iters", type=int, default=5)
        p.add_argument("--bucket-cap-mb", type=float, default=25)
        p.add_argument("--device", default="cpu")
        p.add_argument("--out", required=True, help="JSON file to write (with --lockstep-rank, rank 0 writes it)")
        p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
        p.add_argument("--options-json", default="", help="compressor options as JSON ({name: {key: value}})")
        p.add_argument("--lockstep-rank", type=int, default=None, help="this process's rank of a co-located profile")
        p.add_argument("--lockstep-world", type=int, default=0, help="processes of the co-located profile")
        p.add_argument("--init-method", default="", help="the co-located profile's rendezvous (file://PATH)")
        p.add_argument("--lockstep-codecs-only", action="store_true",
                       help="co-located profile: the compressors in place alone, without the compute phase")  # fmt: skip
        ns = p.parse_args(argv)
        options: dict[str, dict[str, Any]] = {}
        for item in ns.opt:
            key, sep, value = item.partition("=")
            name, dot, opt = key.partition(".")
            if not sep or not dot:
                raise ContractError(f"--opt {item!r} is not NAME.KEY=VALUE")
            options.setdefault(name, {})[opt] = parse_value(value)
        if ns.options_json:
            try:
                options.update(json.loads(ns.options_json))
            except ValueError as e:
                raise ContractError(f"--options-json: not JSON ({e})") from None
        return cls(model=ns.model, batch_size=ns.batch_size, out=ns.out,
                   compressors=tuple(n for n in ns.compressors.split(",") if n), options=options, iters=ns.iters,
                   bucket_cap_mb=ns.bucket_cap_mb, threads=ns.threads, device=ns.device, image_size=ns.image_size,
                   seq_len=ns.seq_len, lockstep_rank=ns.lockstep_rank, lockstep_world=ns.lockstep_world,
                   init_method=ns.init_method, lockstep_codecs_only=ns.lockstep_codecs_only)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ConformanceArgs:
    """The command line of ``python -m runners.conformance`` (one rank of `testbed check-compressor`, gloo on a file
    store), built by the controller (testbed/conformance.py) and parsed by the rank, like ``RankArgs``. ``options``
    are the compressor's options, each sent as ``--opt KEY=JSON``."""

    spec: str
    store: str
    rank: int
    world_size: int
    out: str
    options: tuple[tuple[str, Any], ...] = ()
    steps: int = 4  # steps after the compressor's warm-up
    collective_timeout_s: float = 20.0
    seed: int = 0

    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def to_argv(self) -> list[str]:
        argv = ["--spec", self.spec, "--store", self.store, "--rank", str(self.rank), "--world-size",
                str(self.world_size), "--out", self.out, "--steps", str(self.steps), "--collective-timeout-s",
                f"{self.collective_timeout_s:g}", "--seed", str(self.seed)]  # fmt: skip
        for key, value in self.options:
            argv += ["--opt", f"{key}={json.dumps(value)}"]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> ConformanceArgs:
        """Parse; raises ContractError with one line (the rank exits 2)."""
        p = _Parser(prog="conformance")
        p.add_argument("--spec", required=True)
        p.add_argument("--opt", action="append", default=[])
        p.add_argument("--store", required=True)
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--world-size", type=int, required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--steps", type=int, default=4, help="steps after the compressor's warm-up")
        p.add_argument("--collective-timeout-s", type=float, default=20.0)
        p.add_argument("--seed", type=int, default=0)
        ns = p.parse_args(argv)
        options = []
        for item in ns.opt:
            key, _, value = item.partition("=")
            options.append((key, parse_value(value)))
        return cls(spec=ns.spec, store=ns.store, rank=ns.rank, world_size=ns.world_size, out=ns.out,
                   options=tuple(options), steps=ns.steps, collective_timeout_s=ns.collective_timeout_s,
                   seed=ns.seed)  # fmt: skip
