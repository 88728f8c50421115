"""One small exception hierarchy. The CLI turns each into a one-line message.

The root (`TestbedError`, `InputError`, `PermissionDenied`, `ShapingError`) lives in shaping/errors.py, because
shaping/ is also the host-side tool and imports nothing of testbed/; it is re-exported here, so `except` clauses and
`isinstance` checks see one set of classes. This module adds the controller's own failures.

`InputError` (bad flags, bad files, impossible requests) exits 2 and must be raised before anything is changed.
Every other `TestbedError` is a failure while doing the work (exit 1) and is raised after rolling back.
"""

from pathlib import Path

from shaping.errors import InputError, PermissionDenied, ShapingError, TestbedError

__all__ = [
    "ClusterError",
    "InputError",
    "LaunchError",
    "PermissionDenied",
    "ProbeError",
    "ShapingError",
    "TestbedError",
    "why_not_a_file",
]


class ClusterError(TestbedError):
    """Creating, inspecting or removing a cluster failed."""


class ProbeError(TestbedError):
    """A bandwidth probe (iperf3) failed."""


class LaunchError(TestbedError):
    """Starting, watching or collecting ranks failed."""


def why_not_a_file(path: str | Path) -> str:
    """What an input error says about a path that should be a readable file and is not."""
    return "a directory, not a file" if Path(path).is_dir() else "no such file"
