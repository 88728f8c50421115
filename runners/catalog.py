"""What the built-in compressors and models are, without torch: names, options, ranges, collectives.

The controller (testbed/config.py, the CLI help and flag tables) checks every value here before anything is created
or started, so a rank never sees a value the controller could have refused. The state classes in
runners/compressors/*.py apply the same rules again inside the ranks (tests/unit/runners/test_catalog.py checks that both
agree: option names and defaults, collective kind, rounds, and the error message for each bad value).

This module imports nothing from torch, testbed or shaping.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class Option:
    """One user option of a compressor."""

    name: str
    type: str  # "int" | "float" | "bool" | "choice"
    default: Any
    help: str
    flag: str | None  # the `testbed run/sweep` flag, None when only a sweep file can set it
    minimum: float | None = None  # inclusive unless min_exclusive
    maximum: float | None = None  # inclusive
    min_exclusive: bool = False
    choices: tuple[str, ...] = ()  # type "choice"

    @property
    def accepted(self) -> str:
        """The accepted values in words (as the error messages say them)."""
        if self.type == "bool":
            return "true or false"
        if self.type == "choice":
            return f"one of {', '.join(self.choices)}"
        if self.minimum is not None and self.maximum is not None:
            return f"{'(' if self.min_exclusive else '['}{self.minimum:g}, {self.maximum:g}]"
        if self.type == "int":
            return f"an integer >= {self.minimum:g}"
        return f"a number >= {self.minimum:g}"

    def check(self, compressor: str, value: Any) -> Any:
        """The value, typed (int stays int, float becomes float); ValueError with the state classes' message."""
        if self.type == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{compressor} {self.name} {value!r} is not accepted: expected true or false")
            return value
        if self.type == "choice":
            if value not in self.choices:
                raise ValueError(f"{compressor} {self.name} {value!r} is not accepted: expected {self.accepted}")
            return value
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not self._in_range(value):
                raise ValueError(f"{compressor} {self.name} {value!r} is not accepted: expected {self.accepted}")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not self._in_range(value):
            if self.maximum is not None:
                raise ValueError(f"{compressor} {self.name} {value!r} is outside {self.accepted}")
            raise ValueError(f"{compressor} {self.name} {value!r} is not accepted: expected {self.accepted}")
        return float(value)

    def _in_range(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.minimum is not None and (value <= self.minimum if self.min_exclusive else value < self.minimum):
            return False
        return not (self.maximum is not None and value > self.maximum)


@dataclasses.dataclass(frozen=True)
class Compressor:
    name: str
    summary: str
    collective: str  # "allreduce" | "allgather"
    rounds: int  # dependent collectives per step
    options: tuple[Option, ...] = ()
    overlaps: bool = True  # the hook's communication overlaps backward
    dense: bool = False  # sends every gradient entry (a dense baseline a speedup can be taken over)

    def option(self, name: str) -> Option:
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    @property
    def defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}


# ---------------------------------------------------------------------------------------------- options
def _rank() -> Option:
    return Option("rank", "int", 4, "low-rank approximation rank", "--rank", minimum=1)


def _start_iter() -> Option:
    return Option(
        "start_iter", "int", 2, "iterations of plain all-reduce before compressing (>= 2 with memory)", "--start-iter",
        minimum=0,
    )  # fmt: skip


def _min_rate() -> Option:
    return Option(
        "min_compression_rate", "float", 2.0, "compress a matrix only when it shrinks at least this much",
        "--min-compression-rate", minimum=0,
    )  # fmt: skip


def _error_feedback(default: bool) -> Option:
    return Option("error_feedback", "bool", default, "add the previous step's compression error",
                  "--error-feedback")  # fmt: skip


def _seed() -> Option:
    return Option("seed", "int", 0, "seed of the random initial factors (sweep files only)", None, minimum=0)


def _ratio() -> Option:
    return Option("ratio", "float", 0.01, "fraction of gradient entries sent", "--ratio", minimum=0, maximum=1,
                  min_exclusive=True)  # fmt: skip


COMPRESSORS: dict[str, Compressor] = {
    c.name: c
    for c in (
        Compressor(
            "syncsgd", "uncompressed all-reduce (the baseline)", "allreduce", 1,
            (Option("builtin", "bool", True, "DDP's own C++ all-reduce instead of a Python hook",
                    "--builtin"),), dense=True,
        ),
        Compressor("fp16", "gradients cast to float16 for the all-reduce", "allreduce", 1, dense=True),
        Compressor("bf16", "gradients cast to bfloat16 for the all-reduce", "allreduce", 1, dense=True),
        Compressor(
            "powersgd", "rank-r power iteration, two all-reduces per step (Vogels et al. 2019)", "allreduce", 2,
            (_rank(), _start_iter(), _min_rate(), _error_feedback(True),
             Option("warm_start", "bool", True, "reuse last step's Q factor", "--warm-start"), _seed(),
             Option("flavour", "choice", "testbed", "pytorch: torch's powerSGD_hook exactly (separate all-reduce of "
                    "uncompressed tensors, Q orthogonalised every step)", "--flavour",
                    choices=("testbed", "pytorch"))),
        ),
        Compressor(
            "acpsgd", "alternating P/Q low-rank steps, one all-reduce per step (Zhang et al. 2023)", "allreduce", 1,
            (_rank(), _start_iter(), _min_rate(), _error_feedback(True), _seed()),
        ),
        Compressor("signsgd", "1 bit per entry, all-gathered, majority vote", "allgather", 1, (_error_feedback(False),)),
        Compressor("topk", "the largest |g| entries, all-gathered", "allgather", 1, (_ratio(), _error_feedback(True))),
        Compressor(
            "mstopk", "top-k by multi-sampling threshold search (Shi et al. 2021)", "allgather", 1,
            (_ratio(), Option("samplings", "int", 20, "threshold search steps", "--samplings", minimum=1),
             _error_feedback(True), _seed()),
        ),
    )
}  # fmt: skip


# the compressors that send every gradient entry: the baselines a speedup is taken over (--baseline)
DENSE_BASELINES: tuple[str, ...] = tuple(n for n, c in COMPRESSORS.items() if c.dense)


def names() -> list[str]:
    return list(COMPRESSORS)


# ---------------------------------------------------------------------------------------------- plugins
# A compressor outside the package: "MODULE:FACTORY" (e.g. "randk:make"); FACTORY(process_group=None, **options)
# returns (state, hook) like runners.compressors.get. Entry points of this group name plugins by a short name.
PLUGIN_GROUP = "gc_testbed.compressors"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_plugin_spec(name: str) -> bool:
    """Whether `name` names a plugin (MODULE:FACTORY) rather than a built-in compressor."""
    return isinstance(name, str) and ":" in name


def parse_plugin_spec(spec: str) -> tuple[str, str]:
    """ "pkg.mod:factory" -> ("pkg.mod", "factory"); one-line ValueError when it is not MODULE:FACTORY."""
    module, sep, factory = spec.partition(":")
    if not sep or not _DOTTED.match(module) or not _DOTTED.match(factory):
        raise ValueError(
            f"compressor {spec!r} is not MODULE:FACTORY (a dotted module path, a colon, a factory name, e.g. "
            "examples.randk:make)"
        )
    return module, factory


def compressor(name: str) -> Compressor:
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; valid: {', '.join(COMPRESSORS)}, or a plugin as MODULE:FACTORY")
    return COMPRESSORS[name]


def options_of(name: str) -> tuple[str, ...]:
    return compressor(name).option_names


def option_flags() -> dict[str, tuple[str, str]]:
    """option name -> (CLI flag, type) for every option that has a flag (one flag per name across compressors)."""
    out: dict[str, tuple[str, str]] = {}
    for c in COMPRESSORS.values():
        for o in c.options:
            if o.flag and o.name not in out:
                out[o.name] = (o.flag, o.type)
    return out


def who_accepts(option: str) -> list[str]:
    return [c.name for c in COMPRESSORS.values() if option in c.option_names]


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check `options` for compressor `name` as its state class does; return them typed. One-line ValueError."""
    comp = compressor(name)
    out = {}
    for key, value in options.items():
        if key not in comp.option_names:
            raise ValueError(
                f"option {key!r} does not apply to {name}; {name} accepts: {', '.join(comp.option_names) or 'no options'}"
            )
        out[key] = comp.option(key).check(name, value)
    merged = {**comp.defaults, **out}
    if name == "powersgd" and (merged["error_feedback"] or merged["warm_start"]) and merged["start_iter"] < 2:
        raise ValueError(
            f"powersgd start_iter {merged['start_iter']!r} must be >= 2 when error_feedback or warm_start is on "
            "(DDP rebuilds its buckets after iteration 1)"
        )
    if name == "acpsgd" and merged["start_iter"] < 2:
        raise ValueError(
            f"acpsgd start_iter {merged['start_iter']!r} must be >= 2 (it keeps per-bucket factors and DDP rebuilds "
            "its buckets after iteration 1)"
        )
    return out


# ---------------------------------------------------------------------------------------------- models
@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    summary: str
    uses_image_size: bool = False
    uses_seq_len: bool = False


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("resnet18", "torchvision ResNet-18, random init", uses_image_size=True),
        Model("resnet50", "torchvision ResNet-50, random init", uses_image_size=True),
        Model("resnet101", "torchvision ResNet-101, random init", uses_image_size=True),
        Model("bert-base", "BERT-base masked LM (12 layers, hidden 768)", uses_seq_len=True),
        Model("mlp", "small MLP with a learnable synthetic task (tests)"),
        Model("cnn", "small CNN with a learnable synthetic task (tests)", uses_image_size=True),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
DEFAULT_IMAGE_SIZE = 64
IMAGE_SIZE_RANGE = (8, 2048)  # the runner refuses < 8; above 2048 a batch does not fit anywhere useful
DEFAULT_SEQ_LEN = 128
SEQ_LEN_RANGE = (1, 512)  # BERT-base has 512 learned positions


def check_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODEL_NAMES)}")
    return name


# ---------------------------------------------------------------------------------------------- data sets
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist (IDX, gzip)


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A data set a rank can train on: its shape, classes, split sizes and the models that make sense on it."""

    kind: str  # synthetic | fashion-mnist | cifar10 | imagefolder
    summary: str
    models: tuple[str, ...]  # the models that accept it (input channels and classes follow the data)
    channels: int | None = None  # None: the model's own (synthetic)
    image_size: int | None = None  # None: --image-size (synthetic, imagefolder: resized to it)
    classes: int | None = None  # None: found in the directory (imagefolder) or the model's own (synthetic)
    train_size: int | None = None
    test_size: int | None = None
    mean: float = 0.5  # per-channel normalisation of pixels in [0, 1]
    std: float = 0.25
    takes_dir: bool = False  # spelled KIND:DIR


DATASETS: dict[str, DataSet] = {
    d.kind: d
    for d in (
        DataSet("synthetic", "deterministic random batches (speed only; the default)", MODEL_NAMES),
        DataSet("fashion-mnist", f"Fashion-MNIST, 28x28 grayscale, 10 classes, from {FASHION_MNIST_ROOT}",
                ("cnn", "resnet18"), 1, 28, 10, 60000, 10000, 0.2860, 0.3530),
        DataSet("cifar10", "CIFAR-10 (torchvision's python layout: DIR/cifar-10-batches-py), 32x32 RGB",
                ("cnn", "resnet18"), 3, 32, 10, 50000, 10000, 0.4734, 0.2516, takes_dir=True),
        DataSet("imagefolder", "DIR/train/CLASS/*.png|jpg and DIR/test/CLASS/* (or val/), RGB, resized to --image-size",
                ("cnn", "resnet18", "resnet50", "resnet101"), 3, None, None, takes_dir=True),
    )
}  # fmt: skip
DEFAULT_DATA = "synthetic"
DATA_FORMS = "synthetic, fashion-mnist, cifar10:DIR or imagefolder:DIR (DIR absolute, the same on every host)"


def parse_data(spec: str) -> tuple[DataSet, str | None]:
    """`--data` as typed: (the data set, its directory or None). ValueError naming what is accepted."""
    kind, sep, path = str(spec).partition(":")
    entry = DATASETS.get(kind)
    if entry is None:
        raise ValueError(f"--data {spec!r}: unknown data set; accepted {DATA_FORMS}")
    if entry.takes_dir and (not sep or not path.startswith("/")):
        raise ValueError(f"--data {spec!r}: {kind} needs an absolute directory, e.g. --data {kind}:/data/{kind}")
    if not entry.takes_dir and sep:
        raise ValueError(f"--data {spec!r}: {kind} takes no directory; accepted {DATA_FORMS}")
    if kind == "fashion-mnist":
        return entry, FASHION_MNIST_ROOT
    return entry, path or None


def check_data_model(spec: str, model: str) -> None:
    entry, _ = parse_data(spec)
    if model not in entry.models:
        raise ValueError(f"--model {model} does not train on --data {spec}; models for {entry.kind}: "
                         f"{', '.join(entry.models)}")  # fmt: skip
