"""`testbed check-compressor`: the conformance suite on real gloo ranks (2 processes, loopback, 44 DDP buckets,
per-rank random delays). Every built-in compressor passes; PyTorch's own powerSGD_hook fails the order check with the
reason; a plugin that lies (claims LOSSLESS, forgets its residuals in state_dict) fails exactly those checks.
About 90 s on 2 cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runners import catalog
from testbed.conformance import check_compressor

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
LOSSLESS = {"syncsgd", "fp16", "bf16"}


def _by_name(outcome) -> dict[str, str]:
    return {c.name: c.status for c in outcome.checks}


@pytest.mark.parametrize("name", catalog.names())
def test_every_builtin_compressor_passes(name):
    outcome = check_compressor(name, timeout_s=90)
    status = _by_name(outcome)
    assert outcome.ok, "\n".join(c.line() for c in outcome.checks)
    assert status["order"] == status["replicas"] == status["payload"] == status["pending"] == "pass"
    assert status["state_dict"] == "pass"  # every built-in state is resumable
    assert status["lossless"] == ("pass" if name in LOSSLESS else "skip")


def _cli(*args: str, timeout_s: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip


def test_pytorch_powersgd_hook_fails_the_order_check_with_the_reason():
    done = _cli("check-compressor", "torch_powersgd:make", "--plugin-path", "examples", "--timeout", "40")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    order = next(line for line in lines if line.split()[1] == "order")
    assert order.startswith("FAIL") and ("collective order" in order or "hang" in order), order
    assert "check(s) failed" in lines[-1]


# The example plugin passing through the CLI (exit 0, every check ok, `--opt ratio=...` forwarded) is
# tests/security/test_plugin_code.py::test_check_compressor_imports_nothing_of_the_current_directory; the CLI's text
# lines are read by the test above; what the checks say of randk's state and LOSSLESS, by the liar below (the honest
# class, less two lies, fails nothing else).


LIAR = '''
class Liar(RandKState):
    LOSSLESS = True  # it is not: random-k drops most of each gradient
    TOLERANCE = 1e-3

    def state_dict(self):
        out = super().state_dict()
        out["residuals"] = {}  # forgets the error feedback: a resumed run drifts
        return out


def make_liar(process_group=None, **options):
    return Liar(process_group, **options), randk_hook
'''


def test_a_plugin_that_lies_fails_the_checks_it_breaks(tmp_path):
    (tmp_path / "liar.py").write_text((EXAMPLES / "randk.py").read_text() + LIAR)
    outcome = check_compressor("liar:make_liar", {"ratio": 0.1}, plugin_path=str(tmp_path), timeout_s=90)
    status = _by_name(outcome)
    assert not outcome.ok
    assert status == {"order": "pass", "replicas": "pass", "lossless": "fail", "payload": "pass",
                      "state_dict": "fail", "pending": "pass", "time": "pass"}, status  # fmt: skip


def test_convergence_compares_steps_to_target_with_sync_sgd():
    """`check-compressor --convergence` (issue 33): the small CNN on the real Fashion-MNIST, 2 loopback ranks; sync SGD
    against itself reaches 0.5 in the same steps (pass), and a target out of reach in the budget is a fail that says
    so. About 40 s."""
    from testbed.convergence_check import check_convergence

    line = check_convergence("syncsgd", {}, None, target=0.5, max_steps=250)
    assert line.status == "pass", line.line()
    assert "syncsgd reached 0.5 in 150 steps, syncsgd in 150 (1.00x its steps)" in line.detail
    line = check_convergence("syncsgd", {}, None, target=0.95, max_steps=50)
    assert line.status == "fail" and "never reached 0.95 in 50 steps" in line.detail, line.line()
