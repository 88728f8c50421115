"""The report's straggler section (testbed/report/shapes.py): straggler trials kept off the flat curves, measured
against predicted per straggler rate, with the link that bounded the ring."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from testbed import perfmodel as pm
from testbed.report import build_report
from testbed.results import COLUMNS
from tests.unit.testbed.report.test_report import row

M = 1_000_000


def _frame() -> pd.DataFrame:
    rows = []
    for i, (comp, t_flat, t_slow) in enumerate((("syncsgd", 4.0, 30.0), ("fp16", 2.0, 15.0))):
        rows.append(row(10 * i, "resnet18", 4, 100 * M, comp, t_flat))
        for j, slow in enumerate((50 * M, 10 * M)):
            r = row(10 * i + 1 + j, "resnet18", 4, 100 * M, comp, t_slow * 10 * M / slow)
            rows.append({**r, "host_rates": f'{{"h2": {slow}}}', "min_host_rate_bps": slow, "cross_traffic": 0})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_straggler_trials_are_predicted_at_the_straggler_rate_with_the_bounding_link(tmp_path):
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    rep = build_report(_frame(), tmp_path, profiles=[prof])
    pts = rep.tables["stragglers"].set_index(["variant", "straggler_bps"])
    assert len(pts) == 6  # two compressors x (flat at 100 Mbit/s, h2 at 50 and at 10 Mbit/s)
    # the straggler trials are not points of the flat curves: only the flat ones are in the speedups
    assert set(rep.tables["errors"]["bandwidth"]) == {"100mbit"}
    s = pts.loc[("syncsgd", 10 * M)]
    assert s["measured_ms"] == pytest.approx(30_000) and s["bounding_link"] == "h2 link" and s["trials"] == 1
    assert pts.loc[("syncsgd", 100 * M), "bounding_link"] == "every host link (flat)"
    # the ring steps at its slowest link's pace: the prediction is the flat one at the straggler's rate
    net = pm.model_terms(None).network(4, 10 * M)  # no calibration: the defaults' terms, at the straggler's rate
    want = pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=True).iter_time_s
    assert s["predicted_ms"] == pytest.approx(want * 1e3)
    assert s["error_pct"] == pytest.approx((want * 1e3 - 30_000) / 30_000 * 100)
    for v in ("syncsgd", "fp16"):  # slower straggler, longer predicted step
        assert pts.loc[(v, 10 * M), "predicted_ms"] > pts.loc[(v, 50 * M), "predicted_ms"] > pts.loc[
            (v, 100 * M), "predicted_ms"]
    summary = rep.markdown.read_text()
    assert "## Straggler links" in summary and "| h2 link |" in summary
    assert (tmp_path / "stragglers.csv").is_file()
    assert any(p.name == "straggler_resnet18_bs32_p4_100000000.png" for p in rep.figures)


def test_without_a_profile_the_stragglers_are_drawn_measured_only(tmp_path):
    rep = build_report(_frame(), tmp_path)
    pts = rep.tables["stragglers"]
    assert len(pts) == 6 and pts["predicted_ms"].map(math.isnan).all()
    assert any(p.name.startswith("straggler_") for p in rep.figures)
