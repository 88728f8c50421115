"""Compressor plugins on the controller: find them, check them before anything starts, check the hosts have them.

A plugin spec is ``MODULE:FACTORY`` (runners/plugins.py has the contract). A plugin is code: in local mode it runs as
root, in the describe subprocess, the conformance ranks and every rank of a trial. The controller never imports a
plugin itself (it may import torch): ``inspect`` runs ``python -P -m runners.plugins describe`` in a subprocess, in a
fixed working directory, with the plugin directory and this controller's code root as its PYTHONPATH (nothing of the
user's current directory is importable there), so the plugin's own one-line ValueErrors about its options become
InputErrors (exit 2) before any cluster is touched. ``locate`` finds its source without importing it (`--dry-run`). ``check_hosts`` runs an import of the module on every host of a trial
through the cluster's ``run`` and compares the source's sha256 with the controller's (lab hosts must have the same
plugin at the same path). Installed plugins are named by entry points of the group ``gc_testbed.compressors``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from runners import catalog
from testbed.errors import InputError, LaunchError

DESCRIBE_TIMEOUT_S = 180.0
HOST_CHECK_TIMEOUT_S = 120.0
CODE_ROOT = Path(catalog.__file__).resolve().parents[1]  # the folder holding the runners/ this controller imports
SAFE_CWD = "/"  # the working directory of plugin subprocesses: nothing there is imported (-P) or written


def python_argv(*args: str) -> list[str]:
    """This interpreter with `-P`: neither the current directory nor a script's folder goes on sys.path, so a
    `runners/` package or a `json.py` where the user stands is never imported (it would run as root)."""
    return [sys.executable, "-P", *args]


def plugin_pythonpath(plugin_path: str | None) -> str:
    """The PYTHONPATH of a plugin subprocess: the plugin directory (what the ranks get), then the code root."""
    return ":".join(p for p in (plugin_path, str(CODE_ROOT)) if p)


def entry_points() -> dict[str, str]:
    """Installed plugins: name -> "module:factory" (entry-point group gc_testbed.compressors)."""
    from importlib import metadata

    return {ep.name: ep.value for ep in metadata.entry_points(group=catalog.PLUGIN_GROUP)}


def resolve_name(name: str) -> str:
    """A compressor as the user typed it -> what a Trial holds: a built-in name or a MODULE:FACTORY spec (an
    entry-point name becomes its spec). Unknown names are left for the Trial's check (its message lists them)."""
    name = name.strip()
    if name in catalog.COMPRESSORS or catalog.is_plugin_spec(name):
        return name
    return entry_points().get(name, name)


def check_plugin_path(text: str | None, flag: str = "--plugin-path") -> str | None:
    """An existing directory, made absolute (it is recorded in the trial and handed to every rank)."""
    if text is None:
        return None
    if not text.strip():
        raise InputError(f"{flag} '': empty; expected the directory that holds the plugin module")
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise InputError(f"{flag} {text}: no such directory; expected the directory that holds the plugin module")
    return str(path)


def describe_env(plugin_path: str | None) -> dict[str, str]:
    """The environment of a describe subprocess: this one's, with PYTHONPATH replaced by the plugin path and the
    code root (`plugin_pythonpath`), never the caller's (an empty or relative entry there means the cwd)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # checking a plugin leaves its directory as it was
    env["PYTHONPATH"] = plugin_pythonpath(plugin_path)
    return env


def locate(spec: str, plugin_path: str | None) -> dict[str, Any]:
    """Where a plugin's source is, found without importing or running anything of it (`run --dry-run`): module,
    factory, file and sha256 when the module is a file or package under the plugin path (or, without one, a
    top-level module on this interpreter's path); `imported` is False."""
    import hashlib
    import importlib.machinery

    try:
        module, factory = catalog.parse_plugin_spec(spec)
    except ValueError as e:
        raise InputError(str(e)) from None
    parts = module.split(".")
    found: Path | None = None
    if plugin_path:
        base = Path(plugin_path, *parts)
        found = next((c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()), None)
    elif len(parts) == 1:  # PathFinder searches sys.path's folders; it executes nothing of the module
        where = importlib.machinery.PathFinder.find_spec(module)
        found = Path(where.origin) if where and where.origin and Path(where.origin).is_file() else None
    return {"module": module, "factory": factory, "file": str(found) if found else None,
            "sha256": hashlib.sha256(found.read_bytes()).hexdigest() if found else None, "imported": False}  # fmt: skip


def inspect(spec: str, options: dict[str, Any], plugin_path: str | None) -> dict[str, Any]:
    """Import the plugin in a subprocess, call its factory with `options`, return what it declares (module, file,
    version, sha256, attributes, assumptions). InputError with the plugin's one line when anything is wrong."""
    try:
        catalog.parse_plugin_spec(spec)
    except ValueError as e:
        raise InputError(str(e)) from None
    argv = python_argv("-m", "runners.plugins", "describe", spec)
    for key, value in options.items():
        argv += ["--opt", f"{key}={json.dumps(value)}"]
    try:
        done = subprocess.run(argv, env=describe_env(plugin_path), cwd=SAFE_CWD, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=DESCRIBE_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InputError(f"compressor {spec!r}: importing the plugin took over {DESCRIBE_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit {done.returncode}"
        raise InputError(last.removeprefix("plugins: error: "))
    return json.loads(done.stdout)


def inspect_trials(trials) -> dict[tuple, dict[str, Any]]:
    """Every distinct plugin (spec, options, path) of a list of trials, inspected once; key -> description."""
    out: dict[tuple, dict[str, Any]] = {}
    for t in trials:
        if catalog.is_plugin_spec(t.compressor):
            key = (t.compressor, t.options, t.plugin_path)
            if key not in out:
                out[key] = inspect(t.compressor, dict(t.options), t.plugin_path)
    return out


HOST_CHECK = """
import hashlib, importlib, json, sys
path, module = sys.argv[1], sys.argv[2]
if path:
    sys.path.insert(0, path)
m = importlib.import_module(module)
f = getattr(m, "__file__", None)
print(json.dumps({"file": f, "sha256": hashlib.sha256(open(f, "rb").read()).hexdigest() if f else None}))
"""


def check_hosts(cluster, hosts, spec: str, plugin_path: str | None, sha256: str | None) -> None:
    """The plugin imports on every host (through the cluster's `run`, with the plugin path the ranks get, `-E -P`:
    nothing of the environment's PYTHONPATH or the current directory) and its source is the controller's. LaunchError naming the host otherwise (before any trial starts)."""
    module, _ = catalog.parse_plugin_spec(spec)
    for host in hosts:
        done = cluster.run(host, [sys.executable, "-E", "-P", "-c", HOST_CHECK, plugin_path or "", module],
                           timeout_s=HOST_CHECK_TIMEOUT_S)  # fmt: skip
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr or "").strip().splitlines() if ln.strip()]
            raise LaunchError(
                f"compressor {spec!r} cannot be imported on host {host.name}: {lines[-1] if lines else 'exit ' + str(done.returncode)}"
                f" (plugin path {plugin_path or 'none'}; install it there or copy it to the same path)"
            )
        try:
            there = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise LaunchError(f"host {host.name}: the plugin import check printed {done.stdout!r}") from None
        if sha256 and there.get("sha256") and there["sha256"] != sha256:
            raise LaunchError(
                f"compressor {spec!r}: host {host.name} has another version of {module} ({there['file']}, sha256 "
                f"{there['sha256'][:12]}, here {sha256[:12]}); copy the same file there"
            )


def row_fields(info: dict[str, Any] | None, plugin_path: str | None) -> dict[str, Any]:
    """The results columns of a plugin (all None for a built-in compressor)."""
    if info is None:
        return {"plugin_module": None, "plugin_version": None, "plugin_sha256": None, "plugin_path": None,
                "plugin_assumed": None}  # fmt: skip
    return {
        "plugin_module": info.get("module"),
        "plugin_version": info.get("version"),
        "plugin_sha256": info.get("sha256"),
        "plugin_path": plugin_path,
        "plugin_assumed": "; ".join(info.get("assumed") or []) or None,
    }
