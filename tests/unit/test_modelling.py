"""testbed.modelling: which spread a co-located profile keeps (its own beside companions, or the solo one)."""

from __future__ import annotations

import os

from testbed.modelling import fair_share_cores, oversubscribed


def test_oversubscribed_when_ranks_time_share_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert not oversubscribed(2, 1)  # the 2-host local cluster: a core per rank, the spread beside companions holds
    assert oversubscribed(4, 1)  # 4 ranks on 2 cores: the companions' phase, not the trials' lockstep
    assert oversubscribed(2, 0)  # threads 0: every process wants every core
    assert not oversubscribed(1, 0)
    assert fair_share_cores(4, 1) == 0.5
