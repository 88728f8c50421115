"""Entering a network namespace never creates it: shaping.netns_route is the one opener, and nothing else in the
project calls pyroute2's IPRoute or NetNS (whose default O_CREAT turned a namespace listed a moment ago and removed
since into a new, empty one that nobody removed: testbed ls beside a down, and a full suite's teardown, both did)."""

from __future__ import annotations

import ast
import os
import uuid
from pathlib import Path

import pytest

from shaping.errors import InputError
from shaping.netns_route import open_route, route_for

REPO = Path(__file__).resolve().parents[3]
OPENERS = {"IPRoute", "NetNS"}  # pyroute2's namespace-entering sockets: both open with O_CREAT by default


def calls_to_openers(path: Path) -> list[str]:
    """`file:line name(` for every call of IPRoute or NetNS in a Python file (by name or attribute, not in text)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in OPENERS:
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
                found.append(f"{where}:{node.lineno} {name}(")
    return found


def test_only_netns_route_opens_a_namespace_socket():
    files = [p for pkg in ("shaping", "testbed", "runners", "bench") for p in (REPO / pkg).rglob("*.py")]
    assert len(files) > 50  # the tree was found, not an empty glob
    calls = [c for p in files if p != REPO / "shaping" / "netns_route.py" for c in calls_to_openers(p)]
    assert calls == [], "open namespaces with shaping.netns_route.open_route (never creates one), not: " + ", ".join(
        calls
    )
    opener = calls_to_openers(REPO / "shaping" / "netns_route.py")
    assert opener and all(c.endswith(" IPRoute(") for c in opener)  # the one place, and the check sees its call


def test_the_source_check_finds_a_bare_opener(tmp_path):
    """The check above would fail on a new call site, whether imported by name or reached through the module."""
    probe = tmp_path / "new_call_site.py"
    probe.write_text("import pyroute2\nfrom pyroute2 import IPRoute\nIPRoute(netns='x')\npyroute2.NetNS('y')\n")
    found = calls_to_openers(probe)
    assert [f.split(" ")[1] for f in found] == ["IPRoute(", "NetNS("]


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root (CI runs as root)")
def test_opening_a_missing_namespace_raises_and_leaves_none_behind():
    from pyroute2 import netns

    name = f"tbtest-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(FileNotFoundError):
        open_route(name)
    assert name not in netns.listnetns() and not os.path.exists(f"/run/netns/{name}")
    with pytest.raises(InputError, match=f"network namespace '{name}' does not exist"):
        with route_for(name, "shaping"):
            pass
    assert name not in netns.listnetns()


@pytest.mark.skipif(os.geteuid() != 0, reason="netlink in this namespace needs root (CI runs as root)")
def test_no_namespace_opens_this_process_own():
    with open_route(None) as ipr:
        assert ipr.link_lookup(ifname="lo")  # loopback exists in every namespace, this one included
