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


FLAT_WIRE_S = 0.5  # fp16's flat trials on the wire per iteration; sync SGD's rows have no wire time
PAYLOAD_BYTES = 4e6


def _frame() -> pd.DataFrame:
    rows = []
    for i, (comp, t_flat, t_slow) in enumerate((("syncsgd", 4.0, 30.0), ("fp16", 2.0, 15.0))):
        wire = {"comm_wire_s": FLAT_WIRE_S if comp == "fp16" else None, "payload_bytes_per_iter": PAYLOAD_BYTES}
        rows.append({**row(10 * i, "resnet18", 4, 100 * M, comp, t_flat), **wire})
        for j, slow in enumerate((50 * M, 10 * M)):
            r = {**row(10 * i + 1 + j, "resnet18", 4, 100 * M, comp, t_slow * 10 * M / slow), **wire}
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
    assert s["measured_ms"] == pytest.approx(30_000) and s["trials"] == 1
    assert s["bounding_link"] == "h2 link (10 Mbit/s)"  # perfmodel.ring_bottleneck's name, as racks and flows have
    assert pts.loc[("syncsgd", 100 * M), "bounding_link"] == "every host link (flat)"
    # the ring steps at its slowest link's pace: the prediction is the flat one at the straggler's rate
    net = pm.model_terms(None).network(4, 10 * M)  # no calibration: the defaults' terms, at the straggler's rate
    want = pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=True).iter_time_s
    assert s["predicted_ms"] == pytest.approx(want * 1e3)
    assert s["error_pct"] == pytest.approx((want * 1e3 - 30_000) / 30_000 * 100)
    for v in ("syncsgd", "fp16"):  # slower straggler, longer predicted step
        assert pts.loc[(v, 10 * M), "predicted_ms"] > pts.loc[(v, 50 * M), "predicted_ms"] > pts.loc[
            (v, 100 * M), "predicted_ms"]
    # from the flat trials: their median plus what the collective at 10 Mbit/s takes beyond their wire time
    # (perfmodel.from_flat_trials_s); sync SGD's rows have no wire time: the change of its collective
    def coll_s(comp: str, bps: float) -> float:
        c = prof.compressor(comp)
        return pm.collective_time_s(c.collective, PAYLOAD_BYTES, c.rounds, pm.model_terms(None).network(4, bps),
                                    beside_compute_s=0.0)  # fmt: skip

    fp16 = pts.loc[("fp16", 10 * M)]
    assert coll_s("fp16", 10 * M) > FLAT_WIRE_S  # so the rule adds something: the test tells max(0, .) from 0
    assert fp16["from_flat_ms"] == pytest.approx((2.0 + coll_s("fp16", 10 * M) - FLAT_WIRE_S) * 1e3)
    assert s["from_flat_ms"] == pytest.approx((4.0 + coll_s("syncsgd", 10 * M) - coll_s("syncsgd", 100 * M)) * 1e3)
    assert s["from_flat_error_pct"] == pytest.approx((s["from_flat_ms"] - 30_000) / 30_000 * 100)
    assert math.isnan(pts.loc[("fp16", 100 * M), "from_flat_ms"])  # the flat trials are the base, not predicted
    summary = rep.markdown.read_text()
    assert "## Straggler links" in summary and "| h2 link (10 Mbit/s) |" in summary and "| 100mbit (flat) |" in summary
    html = rep.html.read_text()  # the same section in report.html, its table a table
    assert "<h2>Straggler links</h2>" in html and "<td>h2 link (10 Mbit/s)</td>" in html
    assert (tmp_path / "stragglers.csv").is_file()
    assert any(p.name == "straggler_resnet18_bs32_p4_100000000.png" for p in rep.figures)


def test_without_a_profile_the_stragglers_are_predicted_from_the_flat_trials_only(tmp_path):
    rep = build_report(_frame(), tmp_path)
    pts = rep.tables["stragglers"]
    assert len(pts) == 6 and pts["predicted_ms"].map(math.isnan).all()
    # the collective comes from the catalogue: the straggler points (not the flat bases) are predicted from the flat
    shaped = pts[pts["straggler_bps"] < pts["rate_bps"]]
    assert len(shaped) == 4 and shaped["from_flat_ms"].notna().all() and shaped["from_flat_ms"].gt(0).all()
    assert any(p.name.startswith("straggler_") for p in rep.figures)


def _rack_and_cross_frame() -> pd.DataFrame:
    """Flat trials at 100 Mbit/s, 4 hosts; two racks behind spines at 1:1 and 1:4 (uplinks 200 and 50 Mbit/s); 1 and
    4 flows of cross traffic on the flat switch; and one trial combining racks with cross traffic."""
    rows = []
    for i, (comp, t) in enumerate((("syncsgd", 4.0), ("fp16", 2.0))):
        rows.append(row(20 * i, "resnet18", 4, 100 * M, comp, t))
        for j, (uplink, over) in enumerate(((200 * M, 1.0), (50 * M, 4.0))):
            rows.append({**row(20 * i + 1 + j, "resnet18", 4, 100 * M, comp, t * (1 + j)), "racks": 2,
                         "uplink_bps": uplink, "oversubscription": over, "cross_traffic": 0})  # fmt: skip
        for j, k in enumerate((1, 4)):
            rows.append({**row(20 * i + 5 + j, "resnet18", 4, 100 * M, comp, t * (1.5 + j)), "racks": 1,
                         "cross_traffic": k, "cross_traffic_pairs": "h0<->h2"})  # fmt: skip
        rows.append({**row(20 * i + 9, "resnet18", 4, 100 * M, comp, 9.0), "racks": 2, "uplink_bps": 50 * M,
                     "oversubscription": 4.0, "cross_traffic": 1})  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _beside(flows: int) -> pm.Calibration:
    """A calibration of 4 ranks at 100 Mbit/s beside `flows` flows: a 20 ms step and 30 Mbit/s of bus bandwidth."""
    from tests.unit.testbed.perfmodel.test_calibration import synthetic_bench

    return pm.calibration_from_bench(synthetic_bench(4, 20e-3, 0.3e8, 0.3e8, 1e-9, 0.0), cluster="c",
                                     rate_bps=100 * M, cross_traffic=flows)  # fmt: skip


def test_rack_trials_are_predicted_at_the_spines_share_and_drawn_against_the_oversubscription(tmp_path):
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    rep = build_report(_rack_and_cross_frame(), tmp_path, profiles=[prof])
    pts = rep.tables["racks"].set_index(["variant", "oversubscription"])
    assert len(pts) == 4  # two compressors x (1:1, 1:4); the trial with cross traffic beside racks is not one
    # 1:1: the uplink carries both ring steps that leave the rack at 100 Mbit/s each: the host links bound the ring
    one = pts.loc[("syncsgd", 1.0)]
    assert one["bounding_link"].startswith("h0 link") and one["flat_ms"] == pytest.approx(4000)
    flat = pm.predict_iteration(prof, "syncsgd", pm.model_terms(None).network(4, 100 * M), hook_blocks_backward=True)
    assert one["predicted_ms"] == pytest.approx(flat.iter_time_s * 1e3)
    # 1:4: a 50 Mbit/s uplink, one ring step leaving each rack: the spine bounds the ring at 50 Mbit/s
    four = pts.loc[("syncsgd", 4.0)]
    assert four["bounding_link"].startswith("spine uplink of rack 0") and four["measured_ms"] == pytest.approx(8000)
    slow = pm.predict_iteration(prof, "syncsgd", pm.model_terms(None).network(4, 50 * M), hook_blocks_backward=True)
    assert four["predicted_ms"] == pytest.approx(slow.iter_time_s * 1e3) and slow.iter_time_s > flat.iter_time_s
    summary = rep.markdown.read_text()
    assert "## Racks behind a spine" in summary and "| 2 racks, 1:4 |" in summary
    assert "<h2>Racks behind a spine</h2>" in rep.html.read_text()
    assert (tmp_path / "racks.csv").is_file()
    assert any(p.name == "racks_resnet18_bs32_p4_100000000.png" for p in rep.figures)
    assert any("combine shapes" in n for n in rep.notes)  # the racks + cross traffic trials, said, not drawn


def test_cross_traffic_trials_are_predicted_only_from_a_calibration_beside_as_many_flows(tmp_path):
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    rep = build_report(_rack_and_cross_frame(), tmp_path, profiles=[prof], calibrations=[_beside(1)])
    pts = rep.tables["cross_traffic"].set_index(["variant", "cross_traffic"])
    assert len(pts) == 6  # two compressors x (0 flows: the flat trials, 1 flow, 4 flows)
    assert pts.loc[("syncsgd", 0), "bounding_link"] == "every host link (flat)"
    assert pts.loc[("syncsgd", 0), "measured_ms"] == pytest.approx(4000)
    # beside 1 flow: predicted with the terms calibrated beside 1 flow, at the trial's rate
    one = pts.loc[("syncsgd", 1)]
    net = pm.terms_for([_beside(1)], 4, cross_traffic=1).network(4, 100 * M)
    want = pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=True).iter_time_s
    assert one["predicted_ms"] == pytest.approx(want * 1e3) and one["measured_ms"] == pytest.approx(6000)
    assert one["bounding_link"].endswith("calibrated beside them")
    assert one["predicted_ms"] > pts.loc[("syncsgd", 0), "predicted_ms"]  # slower than the flat prediction
    # beside 4 flows there is no calibration: not predicted, and the row says which command would measure it
    four = pts.loc[("syncsgd", 4)]
    assert math.isnan(four["predicted_ms"]) and "testbed calibrate --cross-traffic 4" in four["bounding_link"]
    summary = rep.markdown.read_text()
    assert "## Cross traffic" in summary and "| 0 (flat) |" in summary
    assert "<h2>Cross traffic</h2>" in rep.html.read_text()
    assert any(p.name == "cross_traffic_resnet18_bs32_p4_100000000.png" for p in rep.figures)
