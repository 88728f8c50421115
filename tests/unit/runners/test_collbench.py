"""The contention probe's length (runners/collbench.py): what --probe-s buys in training steps."""

from __future__ import annotations

from runners.collbench import probe_steps
from runners.contract import DEFAULT_PROBE_S


def test_the_probe_takes_what_probe_s_asks_and_a_shorter_one_gets_a_single_step():
    # at the default, as every stored calibration had: 2 steps at least, 8 at most, about --probe-s of compute
    assert probe_steps(DEFAULT_PROBE_S, 0.9) == 2  # a 2-core VM's CNN step: int(2 / 0.9)
    assert probe_steps(DEFAULT_PROBE_S, 1.5) == 2  # a step longer than half the probe still gets two
    assert probe_steps(DEFAULT_PROBE_S, 0.3) == 6
    assert probe_steps(DEFAULT_PROBE_S, 0.01) == 8
    assert probe_steps(10.0, 2.0) == 5
    # shorter than the default: what it asks for, at least one step (two steps of 0.9 s were 1.8 s for --probe-s 0.5)
    assert probe_steps(0.5, 0.9) == 1
    assert probe_steps(0.5, 0.2) == 2
    assert probe_steps(0.5, 0.0) == 8
