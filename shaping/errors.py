"""The root of the project's error hierarchy. Each error's message is one line for the user.

shaping/ is also the host-side tool on lab machines, so it needs nothing of testbed/: the hierarchy starts here and
testbed/errors.py re-exports these classes and adds the controller's own (cluster, probe, launch).

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
