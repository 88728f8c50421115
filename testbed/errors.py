"""One small exception hierarchy. The CLI turns each into a one-line message.

`InputError` (bad flags, bad files, impossible requests) exits 2 and must be raised before anything is changed.
Every other `TestbedError` is a failure while doing the work (exit 1) and is raised after rolling back.
"""


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose. The message is one line for the user."""

    exit_code = 1


class InputError(TestbedError, ValueError):
    """The user asked for something invalid: says what was given and what is accepted. Nothing was changed."""

    exit_code = 2


class PermissionDenied(TestbedError):
    """The operation needs root or CAP_NET_ADMIN."""

    exit_code = 2


class ShapingError(TestbedError):
    """tc/netlink refused a change, or the kernel lacks a qdisc."""


class ClusterError(TestbedError):
    """Creating, inspecting or removing a cluster failed."""


class ProbeError(TestbedError):
    """A bandwidth probe (iperf3) failed."""


class LaunchError(TestbedError):
    """Starting, watching or collecting ranks failed."""
