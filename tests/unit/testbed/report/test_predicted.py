"""The report's performance-model side (testbed/report/predicted.py): the rate a point stands at, and the efficiency
that makes sync SGD's predictions match its trials, recovered from trials made at a known efficiency."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from testbed import perfmodel as pm
from testbed.report.predicted import ModelSettings, effective_rate, fit_efficiency_from_trials, network


def _profile() -> pm.Profile:
    """One 8 MB bucket ready at the end of a 10 ms backward: sync SGD at 100 Mbit/s is bound by its all-reduce."""
    return pm.profile_from_dict({
        "schema": "testbed.profile/1", "model": "m", "batch_size": 8,
        "forward_s": 0.005, "backward_s": 0.01, "optimizer_s": 0.001,
        "buckets": [{"index": 0, "grad_bytes": 8_000_000, "numel": 2_000_000, "ready_at_s": 0.01}],
        "compressors": {"syncsgd": {"collective": "allreduce", "rounds": 1, "buckets": [
            {"index": 0, "payload_bytes": 8_000_000, "encode_s": 0.0, "decode_s": 0.0}]}},
    })  # fmt: skip


def test_effective_rate_is_the_shaped_rate_or_the_measured_goodput():
    assert effective_rate(1e9, 5e8) == 1e9
    assert effective_rate(0, 9.4e8) == 9.4e8  # unshaped: where the probe put it
    assert effective_rate(0, None) == 0.0 and effective_rate(0, math.nan) == 0.0  # no part in a crossover


@pytest.mark.parametrize("efficiency", [0.5, 0.8])
def test_the_efficiency_fitted_from_sync_sgd_trials_is_the_one_they_were_made_at(efficiency):
    prof, s = _profile(), ModelSettings()
    rates = (50e6, 100e6, 200e6)
    made = ModelSettings(efficiency=efficiency)
    times = [pm.predict_iteration(prof, "syncsgd", network(4, r, 0.0, made)).iter_time_s for r in rates]
    ok = pd.DataFrame({"variant": "syncsgd", "rate_bps": rates, "model": "m", "batch_size": 8, "world_size": 4,
                       "delay_s": 0.0, "t_s": times})  # fmt: skip
    fitted, used = fit_efficiency_from_trials(ok, [prof], s)
    assert used == 3 and fitted == pytest.approx(efficiency, rel=1e-3)
    # trials faster than a perfect link could carry them: efficiency 1, never above
    fitted, _ = fit_efficiency_from_trials(ok.assign(t_s=[t / 10 for t in times]), [prof], s)
    assert fitted == 1.0
