"""A trial (one full configuration) and a sweep (a grid of them): frozen, validated, hashable.

A trial's id is a stable hash of its configuration, so a sweep can skip what is stored and resume after a crash.
Sweeps come from CLI flags or a TOML file; every error names the flag or the TOML key (and line) that was wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from runners import catalog
from runners.contract import TRAINING_DEFAULTS
from shaping.plan import BURST_POLICY, LinkShape
from shaping.units import (
    parse_size_bytes,
    parse_time_s,
    rate_or_unshaped,
)
from testbed import trial_shape
from testbed.errors import InputError

MODELS = catalog.MODEL_NAMES
DEFAULT_RUNNER = "runners.train"
MAX_BUCKET_CAP_MB = 1024.0


def compressor_names() -> list[str]:
    return catalog.names()


def option_flag(key: str) -> str:
    """The CLI flag of a compressor option (sweep files name it `key`)."""
    flag = catalog.option_flags().get(key, (None, None))[0]
    return flag or f"options.{key}"


def check_compressor(name: str, options: dict[str, Any]) -> None:
    """Unknown compressor, options that do not apply or values out of range: InputError before anything starts.
    The same rules the compressor's state class applies inside the ranks (runners/catalog.py).
    A plugin (MODULE:FACTORY) is checked here only for its form and plain option values: its factory checks the
    values, in a subprocess of the CLI (testbed/plugins.py), since importing it may import torch."""
    if catalog.is_plugin_spec(name):
        try:
            catalog.parse_plugin_spec(name)
        except ValueError as e:
            raise InputError(str(e)) from None
        for key, value in options.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise InputError(f"--opt {key!r}: an option name is an identifier, e.g. --opt ratio=0.05")
            if not isinstance(value, str | int | float | bool):
                raise InputError(f"--opt {key}={value!r}: expected a number, true/false or text")
        return
    try:
        entry = catalog.compressor(name)
    except ValueError as e:
        raise InputError(str(e)) from None
    for key in options:
        if key not in entry.option_names:
            flags = ", ".join(option_flag(o) for o in entry.option_names) or "no options"
            users = ", ".join(catalog.who_accepts(key)) or "no compressor"
            raise InputError(
                f"{option_flag(key)} does not apply to {name}; {name} accepts {flags} ({key} is for {users})"
            )
    for key, value in options.items():
        try:
            entry.option(key).check(name, value)
        except ValueError as e:
            raise InputError(f"{option_flag(key)} {value!r}: {e}") from None
    try:
        catalog.check_options(name, options)  # rules between options (e.g. powersgd start_iter with memory)
    except ValueError as e:
        raise InputError(str(e)) from None


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InputError(f"{name} {value!r}: expected an integer {bound}")


@dataclasses.dataclass(frozen=True)
class Trial:
    """Everything that decides a measurement. Two trials with the same fields measure the same thing."""

    compressor: str
    rate_bps: int | None  # None: unshaped
    world_size: int
    # the training settings' defaults have one home, runners.contract.TRAINING_DEFAULTS (the ranks read it too)
    model: str = TRAINING_DEFAULTS.model
    batch_size: int = TRAINING_DEFAULTS.batch_size
    iters: int = TRAINING_DEFAULTS.iters
    warmup_iters: int = TRAINING_DEFAULTS.warmup_iters
    seed: int = TRAINING_DEFAULTS.seed
    burst_bytes: int | None = None
    qdisc: str = "htb"
    delay_s: float = 0.0
    image_size: int = TRAINING_DEFAULTS.image_size
    seq_len: int = TRAINING_DEFAULTS.seq_len
    bucket_cap_mb: float = TRAINING_DEFAULTS.bucket_cap_mb
    serial: bool = False
    overlap: bool = True  # hooks return un-waited futures (communication overlaps backward); off: hooks block
    skew_probe: bool = False  # measure per-collective peer skew (peer_wait_s) with one tiny extra all-gather each
    # observation, not configuration (left out of the id): the marks of the last N measured iterations kept
    # (timeline_rank<r>.json) and N extra iterations under torch.profiler (trace_rank<r>.json); docs/report.md
    timeline_iters: int = 0
    trace_iters: int = 0
    options: tuple[tuple[str, Any], ...] = ()  # compressor options, sorted (key, value) pairs
    cluster: str = "tb"
    runner: str = DEFAULT_RUNNER
    # where and how ranks talk (testbed.launch_plan resolves "auto" and None against the cluster before a run)
    backend: str = "auto"  # auto | gloo | nccl
    ranks_per_host: int | None = None  # torchrun's nproc-per-node; None: the hosts' GPU count, else 1
    intra_host: str = "p2p"  # p2p: NCCL's own NVLink/P2P/SHM inside a host; socket: P2P and SHM off
    nccl_socket_nthreads: int | None = None  # NCCL_SOCKET_NTHREADS (None: NCCL's default)
    nccl_nsocks_perthread: int | None = None  # NCCL_NSOCKS_PERTHREAD (None: NCCL's default)
    nccl_env: tuple[tuple[str, str], ...] = ()  # further NCCL_* settings, sorted (key, value) pairs
    # a plugin's directory (absolute), the only PYTHONPATH entry its ranks get; None for built-in compressors
    plugin_path: str | None = None
    # learning (issue 33): real data, evaluation, a target; left out of the id at their defaults (ids of older trials)
    data: str = catalog.DEFAULT_DATA  # synthetic | fashion-mnist | cifar10:DIR | imagefolder:DIR (runners/catalog.py)
    eval_every: int | None = None  # steps between evaluations on the test split
    target_accuracy: float | None = None  # stop at this test accuracy, in (0, 1]
    max_steps: int | None = None  # training steps in all (warm-up included); default warmup_iters + iters
    lr: float | None = None  # None: the runner's default (runners.contract.RankArgs.lr)
    # cluster shapes (issue 36, testbed/trial_shape.py): left out of the id at their defaults (ids of older trials)
    host_rates: tuple[tuple[str, int | None], ...] = ()  # (host, rate_bps | None) over rate_bps: --host-bw h2=1gbit
    cross_traffic: int = 0  # bulk iperf3 TCP flows (both directions) for the length of the trial
    jitter_s: float = 0.0  # netem, like delay_s (needs sch_netem)
    loss_pct: float = 0.0
    # the cluster's racks and spine uplink (`up --racks --uplink`), set from the cluster by launch_plan.resolve: a trial
    # behind an oversubscribed spine measures something else than the same trial on one switch, so its id differs
    racks: int = 1
    uplink_bps: int | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise InputError(f"--model {self.model!r}: unknown; accepted {', '.join(MODELS)}")
        for name, value, low in (
            ("--world-size", self.world_size, 1),
            ("--batch-size", self.batch_size, 1),
            ("--iters", self.iters, 1),
            ("--warmup-iters", self.warmup_iters, 0),
        ):
            _check_int(name, value, low)
        _check_int("--image-size", self.image_size, *catalog.IMAGE_SIZE_RANGE)
        _check_int("--seq-len", self.seq_len, *catalog.SEQ_LEN_RANGE)
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap <= MAX_BUCKET_CAP_MB:
            raise InputError(f"--bucket-cap-mb {cap!r}: expected a number in (0, {MAX_BUCKET_CAP_MB:g}] (MB)")
        if not isinstance(self.serial, bool):
            raise InputError(f"--serial {self.serial!r}: expected true or false")
        for name, value in (("--overlap", self.overlap), ("--skew-probe", self.skew_probe)):
            if not isinstance(value, bool):
                raise InputError(f"{name} {value!r}: expected true or false")
        check_placement(self)
        check_learning(self)
        check_observation(self)
        trial_shape.check_trial_shape(self)
        check_compressor(self.compressor, dict(self.options))
        if self.plugin_path is not None:
            if not catalog.is_plugin_spec(self.compressor):
                raise InputError(
                    f"--plugin-path applies to MODULE:FACTORY compressors, not to the built-in {self.compressor!r}"
                )
            if not isinstance(self.plugin_path, str) or not self.plugin_path.startswith("/"):
                raise InputError(f"--plugin-path {self.plugin_path!r}: expected an absolute directory path")
        if self.rate_bps is not None:
            _ = self.shape  # validates qdisc/rate/burst combinations
        elif self.burst_bytes is not None or self.delay_s:
            raise InputError("--burst and --delay need a rate: an unshaped trial (--bw none) has no token bucket")

    @property
    def shape(self) -> LinkShape | None:
        if self.rate_bps is None:
            return None
        return LinkShape(self.rate_bps, self.burst_bytes, self.qdisc, self.delay_s, self.jitter_s, self.loss_pct)

    @property
    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def config(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["options"] = self.option_dict
        for key in OBSERVATION_FIELDS:  # what a trial records beside its row does not change what it measures
            del d[key]
        if d["plugin_path"] is None:  # trials of built-in compressors keep the ids they had before plugins
            del d["plugin_path"]
        for key, default in LEARNING_DEFAULTS.items():  # synthetic trials keep the ids they had before issue 33
            if d[key] == default:
                del d[key]
        for key, default in trial_shape.SHAPE_DEFAULTS.items():  # and flat, quiet trials the ids before issue 36
            if d[key] == default:
                del d[key]
        if "host_rates" in d:
            d["host_rates"] = dict(self.host_rates)
        if self.burst_bytes is None and (self.rate_bps or any(r for _, r in self.host_rates)):
            d["burst_policy"] = BURST_POLICY  # shaped with the default bucket: its rule is part of what was measured
        return d

    @property
    def trial_id(self) -> str:
        canonical = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def baseline(self, compressor: str = "syncsgd") -> Trial:
        """The same trial with another compressor and no compressor options (e.g. the syncsgd baseline)."""
        return dataclasses.replace(self, compressor=compressor, options=(), plugin_path=None)

    def label(self) -> str:
        rate = rate_or_unshaped(self.rate_bps)
        opts = "".join(f" {k}={v}" for k, v in self.options)
        data = "" if self.data == catalog.DEFAULT_DATA else f" on {self.data}"
        shape = trial_shape.label(self)
        return f"{self.compressor}{opts} @ {rate}{shape}, {self.world_size} ranks, {self.model} bs{self.batch_size}{data}"


LEARNING_DEFAULTS = {"data": catalog.DEFAULT_DATA, "eval_every": None, "target_accuracy": None, "max_steps": None,
                     "lr": None}  # fmt: skip


def check_learning(t: Trial) -> None:
    """--data, --eval-every, --target-accuracy, --max-steps, --lr: InputError naming the flag and what is accepted."""
    try:
        entry, _ = catalog.parse_data(t.data)
        catalog.check_data_model(t.data, t.model)
    except ValueError as e:
        raise InputError(str(e)) from None
    for name, value in (("--eval-every", t.eval_every), ("--max-steps", t.max_steps)):
        if value is not None:
            _check_int(name, value, 1)
    if t.eval_every is not None and entry.kind == "synthetic":
        raise InputError(f"--eval-every needs a real data set; accepted --data {catalog.DATA_FORMS}")
    a = t.target_accuracy
    if a is not None and (isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a <= 1):
        raise InputError(f"--target-accuracy {a!r}: expected a fraction in (0, 1], e.g. 0.85")
    if a is not None and (t.eval_every is None or t.max_steps is None):
        raise InputError("--target-accuracy needs --eval-every N (how often to test) and --max-steps N (when to give up)")
    if t.max_steps is not None and t.max_steps <= t.warmup_iters:
        raise InputError(f"--max-steps {t.max_steps}: expected more than --warmup-iters {t.warmup_iters}")
    lr = t.lr
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < float("inf")):
        raise InputError(f"--lr {lr!r}: expected a finite learning rate > 0")


OBSERVATION_FIELDS = ("timeline_iters", "trace_iters")


def check_observation(t: Trial) -> None:
    """--timeline N (0 to --iters) and --trace N (>= 0): InputError naming the flag and what is accepted."""
    for name, value in (("--timeline", t.timeline_iters), ("--trace", t.trace_iters)):
        _check_int(name, value, 0)
    if t.timeline_iters > t.iters:
        raise InputError(f"--timeline {t.timeline_iters}: expected 0 to --iters ({t.iters}) measured iterations")


BACKENDS = ("auto", "gloo", "nccl")
INTRA_HOST = ("p2p", "socket")
# NCCL variables the testbed sets itself for every NCCL trial (socket transport on the shaped data interface)
NCCL_PINNED = ("NCCL_NET", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_HOSTID")
NCCL_SOCKET_PRODUCT_MAX = 64  # NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (NCCL refuses more)


def check_placement(t: Trial) -> None:
    """Backend, ranks per host and NCCL settings: InputError naming the flag and what is accepted."""
    if t.backend not in BACKENDS:
        raise InputError(f"--backend {t.backend!r}: accepted {', '.join(BACKENDS)}")
    if t.intra_host not in INTRA_HOST:
        raise InputError(f"--intra-host {t.intra_host!r}: accepted {', '.join(INTRA_HOST)}")
    if t.ranks_per_host is not None:
        if isinstance(t.ranks_per_host, bool) or not isinstance(t.ranks_per_host, int) or t.ranks_per_host < 1:
            raise InputError(f"--ranks-per-host {t.ranks_per_host!r}: expected an integer >= 1")
        if t.world_size % t.ranks_per_host:
            raise InputError(
                f"--world-size {t.world_size} is not a multiple of --ranks-per-host {t.ranks_per_host}; every host "
                f"runs the same number of ranks (e.g. --world-size {t.ranks_per_host * max(1, t.world_size // t.ranks_per_host)})"
            )
    for flag, value in (("--nccl-socket-nthreads", t.nccl_socket_nthreads),
                        ("--nccl-nsocks-perthread", t.nccl_nsocks_perthread)):  # fmt: skip
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64):
            raise InputError(f"{flag} {value!r}: expected an integer from 1 to 64")
    threads, socks = t.nccl_socket_nthreads or 1, t.nccl_nsocks_perthread or 1
    if threads * socks > NCCL_SOCKET_PRODUCT_MAX:
        raise InputError(
            f"--nccl-socket-nthreads {threads} x --nccl-nsocks-perthread {socks} = {threads * socks}; "
            f"NCCL accepts a product of at most {NCCL_SOCKET_PRODUCT_MAX}"
        )
    for key, value in t.nccl_env:
        check_env_pair(key, value, "--nccl-env")
        if not key.startswith("NCCL_"):
            raise InputError(f"--nccl-env {key}=...: only NCCL_* variables are accepted here (use --env for others)")
        if key in NCCL_PINNED or key in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_P2P_DISABLE",
                                         "NCCL_SHM_DISABLE"):  # fmt: skip
            raise InputError(
                f"--nccl-env {key}: set by the testbed (socket transport on the shaped interface); use "
                "--nccl-socket-nthreads, --nccl-nsocks-perthread or --intra-host socket for the ones it exposes"
            )


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_pair(key: str, value: str, flag: str) -> None:
    if not _ENV_NAME.match(key or ""):
        raise InputError(f"{flag} {key!r}: not a variable name; expected KEY=VALUE with KEY like [A-Za-z_][A-Za-z0-9_]*")
    if "\0" in value or "\n" in value:
        raise InputError(f"{flag} {key}: the value contains a NUL or newline; expected one line of text")


def parse_env_pairs(items: list[str] | None, flag: str) -> tuple[tuple[str, str], ...]:
    """`KEY=VALUE` words (repeatable flag) as sorted pairs; a key given twice is refused."""
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"{flag} {item!r}: expected KEY=VALUE")
        check_env_pair(key, value, flag)
        if key in pairs:
            raise InputError(f"{flag} {key} given twice")
        pairs[key] = value
    return tuple(sorted(pairs.items()))


# ----------------------------------------------------------------------------------------- sweeps
SWEEP_KEYS = {
    "bw": 'list of rates, e.g. ["100mbit", "1gbit"]',
    "compressor": "list of compressor names",
    "world_size": "list of integers",
    "model": "a model name",
    "batch_size": "an integer",
    "iters": "an integer",
    "warmup_iters": "an integer",
    "seed": "an integer",
    "burst": 'a size like "125kb"',
    "qdisc": '"htb" or "tbf"',
    "delay": 'a time like "5ms"',
    "image_size": "an integer",
    "seq_len": "an integer",
    "bucket_cap_mb": "a number",
    "serial": "true or false",
    "overlap": "true or false",
    "skew_probe": "true or false",
    "backend": '"auto", "gloo" or "nccl"',
    "ranks_per_host": "an integer (torchrun's nproc-per-node)",
    "intra_host": '"p2p" or "socket"',
    "nccl_socket_nthreads": "an integer 1-64",
    "nccl_nsocks_perthread": "an integer 1-64",
    "nccl_env": 'a table of NCCL_* settings, e.g. [nccl_env] NCCL_ALGO = "Ring"',
    "options": "a table of compressor -> {option = value}, e.g. [options.powersgd] rank = 4",
    "plugin_path": 'the directory of MODULE:FACTORY plugins, relative to the sweep file, e.g. "../examples"',
    "data": '"synthetic", "fashion-mnist", "cifar10:DIR" or "imagefolder:DIR"',
    "eval_every": "an integer (steps between evaluations)",
    "target_accuracy": "a fraction in (0, 1]",
    "max_steps": "an integer",
    "lr": "a number > 0",
}


def parse_list(text: str | list, what: str) -> list[str]:
    raw = text if isinstance(text, list) else str(text).split(",")
    items = [str(x).strip() for x in raw]
    if not any(items):
        raise InputError(f"{what}: empty; expected a comma-separated list")
    if not all(items):  # `--bw "$A,$B"` with B unset: refuse, never drop the value silently
        blank = [str(i + 1) for i, x in enumerate(items) if not x]
        raise InputError(f"{what} {text!r}: item {', '.join(blank)} of {len(items)} is empty (an unset variable?)")
    return items


def parse_rates(items: list[str], what: str = "--bw") -> list[int | None]:
    """Rates in bits/s, None for `none`; `0` is refused (trial_shape.parse_rate_or_none: one rule for every flag)."""
    return [trial_shape.parse_rate_or_none(x, what) for x in items]


def expand(
    rates: list[int | None],
    compressors: list[str],
    world_sizes: list[int],
    *,
    options: dict[str, dict[str, Any]] | None = None,
    plugin_path: str | None = None,
    **common: Any,
) -> list[Trial]:
    """The grid, ordered to minimise re-shaping (all trials at one rate together) and with baselines first.
    `plugin_path` goes to the plugin (MODULE:FACTORY) compressors of the grid."""
    options = options or {}
    trials = []
    for rate, ws, comp in itertools.product(rates, world_sizes, compressors):
        opts = tuple(sorted(options.get(comp, {}).items()))
        path = plugin_path if catalog.is_plugin_spec(comp) else None
        trials.append(Trial(compressor=comp, rate_bps=rate, world_size=ws, options=opts, plugin_path=path, **common))
    order = {c: i for i, c in enumerate(sorted(compressors, key=lambda c: c != "syncsgd"))}
    trials.sort(key=lambda t: (t.rate_bps or 0, t.world_size, order[t.compressor]))
    return list(dict.fromkeys(trials))


def load_sweep_toml(path: str | Path, **overrides: Any) -> list[Trial]:
    """Read a sweep file. Errors name the key (and for syntax errors the line)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise InputError(f"--config {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise InputError(f"--config {path}: not UTF-8 text (byte {e.start}); expected a TOML sweep file") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"--config {path}: invalid TOML: {' '.join(str(e).split())}") from None
    sweep = doc.get("sweep", doc)
    if not isinstance(sweep, dict):
        raise InputError(f"{path}:{_line_of(text, 'sweep')}: sweep = {sweep!r}; expected a [sweep] table")
    unknown = sorted(set(sweep) - set(SWEEP_KEYS))
    if unknown:
        line = _line_of(text, unknown[0])
        raise InputError(f"{path}:{line}: unknown key {unknown[0]!r}; accepted keys: {', '.join(SWEEP_KEYS)}")
    for key in ("bw", "compressor", "world_size"):
        if key not in sweep:
            raise InputError(f"{path}: missing key {key!r} ({SWEEP_KEYS[key]})")

    def get(key: str, kind: type, default: Any = None) -> Any:
        if key not in sweep:
            return default
        value = sweep[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise InputError(f"{path}:{_line_of(text, key)}: {key} = {value!r}; expected {SWEEP_KEYS[key]}")
        return value

    bws, comps, sizes = get("bw", list), get("compressor", list), get("world_size", list)
    for key, value in (("bw", bws), ("compressor", comps), ("world_size", sizes)):
        if not value:
            raise InputError(f"{path}:{_line_of(text, key)}: {key} = []: an empty grid; expected {SWEEP_KEYS[key]}")
    if not all(isinstance(w, int) and not isinstance(w, bool) for w in sizes):
        raise InputError(
            f"{path}:{_line_of(text, 'world_size')}: world_size = {sizes!r}; expected {SWEEP_KEYS['world_size']}"
        )
    if not all(isinstance(c, str) for c in comps):
        raise InputError(
            f"{path}:{_line_of(text, 'compressor')}: compressor = {comps!r}; expected {SWEEP_KEYS['compressor']}"
        )
    options = get("options", dict, {})
    for comp, opts in options.items():
        if comp not in comps:
            raise InputError(
                f"{path}:{_line_of(text, comp)}: options for {comp!r}, which is not in compressor = {comps!r}; "
                "add it to the grid or remove its options"
            )
        if not isinstance(opts, dict):
            raise InputError(
                f"{path}:{_line_of(text, comp)}: options.{comp} = {opts!r}; expected {SWEEP_KEYS['options']}"
            )
    common: dict[str, Any] = {}
    for key, kind in (
        ("model", str),
        ("batch_size", int),
        ("iters", int),
        ("warmup_iters", int),
        ("seed", int),
        ("qdisc", str),
        ("image_size", int),
        ("seq_len", int),
        ("bucket_cap_mb", float),
        ("serial", bool),
        ("overlap", bool),
        ("skew_probe", bool),
        ("backend", str),
        ("ranks_per_host", int),
        ("intra_host", str),
        ("nccl_socket_nthreads", int),
        ("nccl_nsocks_perthread", int),
        ("data", str),
        ("eval_every", int),
        ("target_accuracy", float),
        ("max_steps", int),
        ("lr", float),
    ):
        value = get(key, kind)
        if value is not None:
            common[key] = value
    if "burst" in sweep:
        common["burst_bytes"] = parse_size_bytes(get("burst", str), f"{path}: burst")
    if "nccl_env" in sweep:
        table = get("nccl_env", dict)
        common["nccl_env"] = parse_env_pairs([f"{k}={v}" for k, v in table.items()], f"{path}: nccl_env")
    if "delay" in sweep:
        common["delay_s"] = parse_time_s(get("delay", str), f"{path}: delay")
    if "plugin_path" in sweep:
        plugin_dir = (path.parent / get("plugin_path", str)).resolve()
        if not plugin_dir.is_dir():
            raise InputError(
                f"{path}:{_line_of(text, 'plugin_path')}: plugin_path = {sweep['plugin_path']!r}: no such directory "
                f"({plugin_dir}); expected {SWEEP_KEYS['plugin_path']}"
            )
        common["plugin_path"] = str(plugin_dir)
    common.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return expand(
            parse_rates([str(b) for b in bws], f"{path}: bw"), [str(c) for c in comps], sizes, options=options, **common
        )
    except InputError as e:
        raise InputError(f"{path}: {e}") from None


def _line_of(text: str, key: str) -> int:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=|^\s*\[.*{re.escape(key)}.*\]", re.M)
    m = pattern.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else 1
