"""The one way the project opens an rtnetlink socket (pyroute2's IPRoute) in a network namespace: never creating it.

pyroute2's `IPRoute(netns=NAME)` opens the namespace with O_CREAT by default, so a name that does not exist (a typo,
or a namespace removed a moment ago by its cluster's `down`) silently becomes a new, empty namespace that nobody
removes. Every namespace the testbed enters it made itself first (`testbed.cluster.topology.create_namespace`), so
nothing here ever needs the create: `open_route` opens with `flags=0`, and tests/unit/shaping/test_netns_route.py
refuses an `IPRoute(` anywhere else in the project. `interface_index` is the one lookup of a user's interface name in
such a socket, with the error that names the interfaces there are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyroute2 import IPRoute

from shaping.errors import InputError, PermissionDenied


def open_route(netns: str | None) -> IPRoute:
    """An IPRoute in `netns` (None: this process's own namespace), for use as a context manager. A namespace that does
    not exist raises OSError (FileNotFoundError) and is not created; no root raises PermissionError."""
    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


@contextlib.contextmanager
def route_for(netns: str | None, needs: str) -> Iterator[IPRoute]:
    """`open_route` for a user's request, with its failures as the user's errors: no root is PermissionDenied ("`needs`
    needs root or CAP_NET_ADMIN"), a missing namespace an InputError naming it. Closed on leaving."""
    try:
        ipr = open_route(netns)
    except PermissionError:
        raise PermissionDenied(f"{needs} needs root or CAP_NET_ADMIN") from None
    except OSError as e:
        raise InputError(f"network namespace {netns!r} does not exist ({e.strerror or e})") from None
    try:
        yield ipr
    finally:
        ipr.close()


def interface_index(ipr: IPRoute, ifname: str, netns: str | None) -> int:
    """The index of `ifname` in `ipr`'s namespace (`netns`, for the message); an InputError naming the interfaces there
    are when it has none of that name."""
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        where = f" in namespace {netns}" if netns else ""
        names = ", ".join(sorted(str(link.get("ifname")) for link in ipr.get_links()))
        raise InputError(f"no interface {ifname!r}{where}; there are: {names}")
    return found[0]
