"""Plugin specs on the controller, without torch in this process: Trial ids, the plan's PYTHONPATH, the host check."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from testbed.config import Trial
from testbed.errors import InputError, LaunchError
from testbed.plugins import HOST_CHECK, check_hosts, resolve_name

REPO = Path(__file__).resolve().parents[3]


def test_builtin_trial_ids_do_not_change_with_the_plugin_field():
    t = Trial(compressor="syncsgd", rate_bps=100_000_000, world_size=2)
    assert "plugin_path" not in t.config()
    p = Trial(compressor="randk:make", rate_bps=100_000_000, world_size=2, plugin_path="/x", options=(("ratio", 0.1),))
    assert p.config()["plugin_path"] == "/x" and p.trial_id != t.trial_id
    assert p.baseline().plugin_path is None and p.baseline().trial_id == t.trial_id


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"compressor": "randk:"}, "is not MODULE:FACTORY"),
        ({"compressor": "syncsgd", "plugin_path": "/x"}, "--plugin-path applies to MODULE:FACTORY"),
        ({"compressor": "randk:make", "plugin_path": "rel"}, "absolute"),
        ({"compressor": "randk:make", "options": (("ratio", [1]),)}, "expected a number"),
    ],
)
def test_bad_plugin_trials(kwargs, why):
    with pytest.raises(InputError, match=why):
        Trial(rate_bps=None, world_size=2, **kwargs)


def test_names_resolve_to_specs():
    assert resolve_name("powersgd") == "powersgd"
    assert resolve_name(" randk:make ") == "randk:make"
    assert resolve_name("zip") == "zip"  # left for the Trial's message


class FakeCluster:
    """Runs the host check here (as a host would), optionally with another plugin file or none."""

    def __init__(self, path: str):
        self.path = path

    def run(self, host, argv, *, timeout_s=60.0):
        argv = [a if a != argv[-2] else self.path for a in argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


class H:
    name = "h1"


def test_host_check_imports_and_compares_the_source(tmp_path):
    examples = str(REPO / "examples")
    sha = hashlib.sha256((REPO / "examples" / "randk.py").read_bytes()).hexdigest()
    check_hosts(FakeCluster(examples), [H()], "randk:make", examples, sha)  # same file: fine
    other = tmp_path / "randk.py"
    other.write_text((REPO / "examples" / "randk.py").read_text() + "# edited\n")
    with pytest.raises(LaunchError, match="host h1 has another version of randk"):
        check_hosts(FakeCluster(str(tmp_path)), [H()], "randk:make", examples, sha)
    with pytest.raises(LaunchError, match="cannot be imported on host h1"):
        check_hosts(FakeCluster(str(tmp_path / "none")), [H()], "randk:make", examples, sha)
    assert "sys.path.insert(0, path)" in HOST_CHECK


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.2]:1234: Connection "
        "reset by peer\nRuntimeError: Application timeout caused pair closure",  # gloo 2.14: closed by the timeout
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
        "op.nbytes. 4096 vs 64",  # a message of another collective's size arrived
    ],
)
def test_check_compressor_names_a_collective_order_failure_from_either_wording(tmp_path, log):
    from testbed.conformance import crash_reason

    (tmp_path / "rank1.log").write_text("train step 3\n" + log + "\n")
    (tmp_path / "rank1.stage").write_text("step 3")
    reason = crash_reason(tmp_path, 1, 1)
    assert reason.startswith("collective order: ranks issued collectives in different orders")
    assert "rank 1 exited with code 1 at 'step 3'" in reason
    (tmp_path / "rank0.log").write_text("Traceback (most recent call last):\nValueError: bad shape\n")
    plain = crash_reason(tmp_path, 0, 1)
    assert plain == "crash: rank 0 exited with code 1 at 'not started': ValueError: bad shape"
