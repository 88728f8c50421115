"""Compressors from outside the package: ``MODULE:FACTORY`` specs, loaded inside a rank (or a describe subprocess).

A plugin is a module with a factory ``FACTORY(process_group=None, **options) -> (state, hook)``, exactly like
``runners.compressors.get``: ``ddp_model.register_comm_hook(state, hook)`` must accept the pair. Bad options raise a
one-line ``ValueError`` from the factory (the testbed shows it as it is, exit 2, before anything starts).

Optional class attributes on the state tell the performance model, the report and the conformance check what the
compressor does; without them the testbed measures what it can and says what it assumed:

  COLLECTIVE  "allreduce" | "allgather"    the collective of its payload (model: allreduce assumed)
  ROUNDS      int >= 1                     dependent collectives per step (model: counted by the profile, else 1)
  OVERLAPS    bool                         its communication overlaps backward (model: True assumed)
  LOSSLESS    bool                         gradients equal sync SGD's within TOLERANCE (checked by check-compressor)
  TOLERANCE   float                        relative tolerance of LOSSLESS (default 1e-6)

Payload accounting: a state derived from ``runners.compressors.CompressorState`` reports its own payload through
``state.stats`` (``add_payload``), encode/decode intervals included. Any other state is wrapped by ``PluginAdapter``:
the bytes handed to torch.distributed collectives *during the hook call* are counted as its payload and the whole
hook call is timed as encode (``ASSUMED`` lists these assumptions; results and profiles record them).

``python -m runners.plugins describe SPEC [--opt key=value ...]`` imports the plugin, calls its factory and prints
what it declares as JSON (module, file, version, sha256 of the source, attributes); a bad spec prints one line
``plugins: error: ...`` and exits 2. The controller runs this in a subprocess, so it never imports torch itself.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import sys
import threading
from typing import Any

from runners.catalog import PLUGIN_GROUP, parse_plugin_spec

ATTRIBUTES = ("COLLECTIVE", "ROUNDS", "OVERLAPS", "LOSSLESS", "TOLERANCE")
COLLECTIVES = ("allreduce", "allgather")
DEFAULT_TOLERANCE = 1e-6


# ----------------------------------------------------------------------------------------------- loading
def import_plugin(spec: str):
    """(module, factory) of a spec; one-line ValueError when the module or the factory is missing."""
    module_name, factory_name = parse_plugin_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ValueError(
                f"compressor {spec!r}: no module named {module_name!r} on the plugin path (give its directory with "
                "--plugin-path DIR)"
            ) from None
        raise ValueError(f"compressor {spec!r}: importing {module_name} failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - any import-time error of foreign code, shown in one line
        raise ValueError(f"compressor {spec!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    factory = module
    for part in factory_name.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ValueError(f"compressor {spec!r}: module {module_name} has no factory {factory_name!r}")
    if not callable(factory):
        raise ValueError(f"compressor {spec!r}: {module_name}.{factory_name} is not callable")
    return module, factory


def build(spec: str, process_group=None, **options) -> tuple[Any, Any]:
    """Call the plugin's factory; check it returned (state, hook). One-line ValueError otherwise."""
    _, factory = import_plugin(spec)
    try:
        made = factory(process_group=process_group, **options)
    except ValueError as e:  # the plugin's own one-line message about its options
        raise ValueError(f"compressor {spec!r}: {' '.join(str(e).split())}") from None
    except TypeError as e:
        raise ValueError(f"compressor {spec!r}: the factory does not accept these options: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"compressor {spec!r}: the factory raised {type(e).__name__}: {e}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[1])):
        raise ValueError(
            f"compressor {spec!r}: the factory returned {type(made).__name__}; expected a (state, hook) tuple with "
            "a callable hook(state, bucket) -> torch.futures.Future"
        )
    state = made[0]
    _check_attributes(spec, state)
    return made


def _check_attributes(spec: str, state) -> None:
    coll = getattr(state, "COLLECTIVE", None)
    if coll is not None and coll not in COLLECTIVES:
        raise ValueError(f"compressor {spec!r}: COLLECTIVE {coll!r}; expected one of {', '.join(COLLECTIVES)}")
    rounds = getattr(state, "ROUNDS", None)
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
        raise ValueError(f"compressor {spec!r}: ROUNDS {rounds!r}; expected an integer >= 1")
    for name in ("OVERLAPS", "LOSSLESS"):
        value = getattr(state, name, None)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"compressor {spec!r}: {name} {value!r}; expected True or False")
    tol = getattr(state, "TOLERANCE", None)
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 <= tol < 1):
        raise ValueError(f"compressor {spec!r}: TOLERANCE {tol!r}; expected a number in [0, 1)")


def reports_own_payload(state) -> bool:
    """True for CompressorState-like states (their hooks fill ``state.stats``); False: the adapter measures."""
    from runners.timing import CommStats

    return isinstance(getattr(state, "stats", None), CommStats) and hasattr(state, "warmup_iters")


def source_facts(module) -> dict[str, Any]:
    """File, sha256 of its source and version (``__version__`` or the installed distribution's) of a module."""
    path = getattr(module, "__file__", None)
    digest = None
    if path:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            from importlib import metadata

            dists = metadata.packages_distributions().get(module.__name__.split(".")[0])
            version = metadata.version(dists[0]) if dists else None
        except Exception:  # noqa: BLE001 - a version is a nicety
            version = None
    return {
        "module": module.__name__,
        "file": path,
        "sha256": digest,
        "version": None if version is None else str(version),
    }


def describe(spec: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a plugin declares, as JSON-able data (see the module docstring)."""
    module, _ = import_plugin(spec)
    state, _hook = build(spec, **(options or {}))
    attrs = {name: getattr(state, name, None) for name in ATTRIBUTES}
    own = reports_own_payload(state)
    opts = None
    if callable(getattr(state, "options", None)):
        with contextlib.suppress(Exception):
            opts = json.loads(json.dumps(state.options(), default=str))
    out = {
        "spec": spec,
        **source_facts(module),
        "attributes": attrs,
        "payload_accounting": "reported" if own else "measured",
        "state_dict": callable(getattr(state, "state_dict", None))
        and callable(getattr(state, "load_state_dict", None)),
        "options": opts,
        "assumed": assumed(state),
        "summary": (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else "",
    }
    with contextlib.suppress(Exception):
        if callable(getattr(state, "close", None)):
            state.close()
    return out


def assumed(state) -> list[str]:
    """What the testbed assumes because the state does not say it."""
    out = []
    if getattr(state, "COLLECTIVE", None) is None:
        out.append("collective allreduce (COLLECTIVE not declared)")
    if getattr(state, "ROUNDS", None) is None:
        out.append("rounds as counted by the profile (ROUNDS not declared)")
    if getattr(state, "OVERLAPS", None) is None:
        out.append("communication overlaps backward (OVERLAPS not declared)")
    if not reports_own_payload(state):
        out.append("payload = bytes handed to collectives during the hook call; encode = the whole hook call")
    return out


# ----------------------------------------------------------------------------------------------- counting
class CollectiveCounter:
    """Bytes handed to torch.distributed collectives, counted by wrappers installed once per process
    (``install_counters``). ``count()`` counts the calling thread's collectives while active; ``all_threads``
    counts every thread's (the conformance check uses it to compare with what a compressor reports)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.total_calls = 0
        self.all_threads = False
        self.pending: list = []  # async works issued while all_threads is on (checked for completion at exit)
        self.names: list[str] = []
        self.before = None  # called right before every collective (the conformance check's random delays)

    @contextlib.contextmanager
    def count(self):
        acc = [0, 0]
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(acc)
        try:
            yield acc
        finally:
            stack.pop()

    def record(self, name: str, nbytes: int, work) -> None:
        for acc in getattr(self._local, "stack", ()):
            acc[0] += nbytes
            acc[1] += 1
        if self.all_threads:
            with self._lock:
                self.total_bytes += nbytes
                self.total_calls += 1
                self.names.append(name)
                if work is not None and hasattr(work, "is_completed"):
                    self.pending.append(work)

    def reset_totals(self) -> None:
        with self._lock:
            self.total_bytes = self.total_calls = 0
            self.pending = []
            self.names = []


COUNTER = CollectiveCounter()
_INSTALLED = [False]
# collective -> how its per-rank payload is read from the arguments: the tensor this rank contributes
_PAYLOAD_ARG = {
    "all_reduce": 0,
    "all_gather_into_tensor": 1,
    "all_gather_single": 1,
    "_all_gather_base": 1,
    "all_gather": 1,
    "reduce_scatter_tensor": 1,
    "broadcast": 0,
    "reduce": 0,
    "all_to_all_single": 1,
}


_KW = ("tensor", "input_tensor", "input")


def _nbytes(obj) -> int:
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    return int(obj.numel() * obj.element_size()) if hasattr(obj, "numel") else 0


def install_counters() -> CollectiveCounter:
    """Wrap the torch.distributed collectives so that ``COUNTER`` sees every call (idempotent). Install it before
    a module binds a collective at import (runners.compressors.base does)."""
    if _INSTALLED[0]:
        return COUNTER
    import torch.distributed as dist

    for name, pos in _PAYLOAD_ARG.items():
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def wrapped(*a, _fn=fn, _name=name, _pos=pos, **k):
            if COUNTER.before is not None:
                COUNTER.before()
            work = _fn(*a, **k)
            arg = a[_pos] if len(a) > _pos else next((k[n] for n in _KW if n in k), None)
            COUNTER.record(_name, _nbytes(arg), work)
            return work

        wrapped.__name__ = name
        wrapped.__wrapped__ = fn
        setattr(dist, name, wrapped)
    _INSTALLED[0] = True
    return COUNTER


# ----------------------------------------------------------------------------------------------- adapter
class PluginAdapter:
    """Gives a plugin state without the testbed's bookkeeping what the runner reads (stats, warmup_iters, options,
    close, state_dict); ``adapter_hook`` calls the plugin's hook with the plugin's own state."""

    builtin = False

    def __init__(self, spec: str, inner, hook) -> None:
        from runners.timing import CommStats

        install_counters()
        self.spec = spec
        self.inner = inner
        self.hook = hook
        self.stats = CommStats()
        self.overlap = True
        for name in ATTRIBUTES:
            setattr(self, name, getattr(inner, name, None))

    @property
    def warmup_iters(self) -> int:
        return int(getattr(self.inner, "warmup_iters", 0) or 0)

    def options(self) -> dict:
        fn = getattr(self.inner, "options", None)
        return dict(fn()) if callable(fn) else {}

    def close(self) -> None:
        fn = getattr(self.inner, "close", None)
        if callable(fn):
            fn()

    def __getattr__(self, name: str):  # state_dict, load_state_dict and anything else the plugin offers
        if name in ("inner", "__setstate__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PluginAdapter({self.spec}, {self.inner!r})"


def adapter_hook(adapter: PluginAdapter, bucket):
    """The plugin's hook, timed (the whole call as encode) and its in-hook collectives counted as payload."""
    stats = adapter.stats
    index = bucket.index()
    stats.bind(bucket.buffer().device)
    with COUNTER.count() as acc:
        t = stats.start()
        fut = adapter.hook(adapter.inner, bucket)
        stats.stop("encode", index, t)
    stats.add_payload(index, acc[0], acc[1])
    stats.end_hook()
    return fut


def get(spec: str, process_group=None, overlap: bool = True, **options):
    """``runners.compressors.get`` for a plugin spec: (state, hook) ready for the runner. A state that reports its
    own payload is used as it is; any other is wrapped in a ``PluginAdapter``."""
    state, hook = build(spec, process_group=process_group, **options)
    if reports_own_payload(state):
        with contextlib.suppress(AttributeError):
            state.overlap = overlap
        return state, hook
    return PluginAdapter(spec, state, hook), adapter_hook


# ----------------------------------------------------------------------------------------------- entry points
def entry_points() -> dict[str, str]:
    """Installed plugins: entry-point name -> "module:factory" (group ``gc_testbed.compressors``)."""
    from importlib import metadata

    return {ep.name: ep.value for ep in metadata.entry_points(group=PLUGIN_GROUP)}


def _parse_opts(items: list[str]) -> dict[str, Any]:
    from runners.contract import parse_value

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--opt {item!r} is not KEY=VALUE")
        out[key] = parse_value(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="plugins", description="Describe a compressor plugin (JSON on stdout).")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("describe")
    d.add_argument("spec")
    d.add_argument("--opt", action="append", default=[])
    args = p.parse_args(argv)
    try:
        info = describe(args.spec, _parse_opts(args.opt))
    except ValueError as e:
        print(f"plugins: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(info, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
