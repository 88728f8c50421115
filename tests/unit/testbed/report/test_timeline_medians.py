"""The timeline's per-bucket medians (testbed/report/timeline.py, `bucket_medians`): what a trial run with
`--timeline N` says about each bucket's collective against backward, summed over every kept iteration of every rank,
and written beside the report. Timelines made here, in the format runners/timeline.py writes."""

import json

import pandas as pd
import pytest

from testbed.report.timeline import bucket_medians, describe_medians, report_timelines


def iteration(k: int, backward_end_s: float, b0_end_s: float, exposed_s: float | None) -> dict:
    """Forward 0-0.1 s, backward compute 0.1 s to `backward_end_s`; bucket 0 ready at 0.2 s, its all-reduce 0.2 s to
    `b0_end_s`; bucket 1 ready at the end of backward, two rounds on the wire (30 and 20 ms, 5 ms apart)."""
    b1 = backward_end_s
    return {
        "iter": k, "t0_wall_s": 100.0 + k, "iter_time_s": b1 + 0.1, "backward_window_s": [0.1, b1],
        "comm_exposed_spans": [[b1, b1 + 0.055]],
        "overlap": {"comm_exposed_s": exposed_s, "comm_hidden_s": 0.1},
        "spans": [
            {"lane": "compute", "name": "forward", "start_s": 0.0, "end_s": 0.1},
            {"lane": "compute", "name": "backward", "start_s": 0.1, "end_s": b1},
            {"lane": "wire", "name": "collective", "bucket": 0, "seq": 0, "start_s": 0.2, "end_s": b0_end_s,
             "waited": False},
            {"lane": "wire", "name": "collective", "bucket": 1, "seq": 0, "start_s": b1, "end_s": b1 + 0.03,
             "waited": True},
            {"lane": "wire", "name": "collective", "bucket": 1, "seq": 1, "start_s": b1 + 0.035, "end_s": b1 + 0.055,
             "waited": True},
        ],
        "points": [{"name": "bucket ready", "bucket": 0, "t_s": 0.2}, {"name": "bucket ready", "bucket": 1, "t_s": b1},
                   {"name": "backward compute end", "t_s": b1}],
    }  # fmt: skip


def docs() -> list[dict]:
    # rank 0: backward ends at 0.4 s in every iteration; rank 1 at 0.4, 0.42 and 0.5 s. Bucket 0's all-reduce ends
    # at 0.45 s (50 ms past backward on the first two samples' ranks)
    ends = {0: (0.4, 0.4, 0.4), 1: (0.4, 0.42, 0.5)}
    return [{"format": "testbed-timeline", "rank": r, "clock_offset_s": 0.0,
             "iterations": [iteration(k, ends[r][k], 0.45, 0.055) for k in range(3)]} for r in (0, 1)]  # fmt: skip


def test_the_medians_split_each_buckets_wire_time_at_the_end_of_backward():
    top, b = bucket_medians(docs())
    assert top["samples"] == 6 and top["ranks"] == 2
    assert top["backward_ms"] == pytest.approx(300.0)  # 300, 300, 300, 300, 320, 400
    assert top["iteration_ms"] == pytest.approx(500.0) and top["exposed_ms"] == pytest.approx(55.0)
    assert list(b["bucket"]) == [0, 1]
    b0, b1 = b.iloc[0], b.iloc[1]
    # bucket 0: ready 100 ms into backward, 250 ms on the wire; beside backward 200 ms where backward ends at 0.4 s
    # (four of six samples), 220 and 250 ms on the others
    assert b0["ready_ms"] == pytest.approx(100.0) and b0["wire_start_ms"] == pytest.approx(100.0)
    assert b0["wire_ms"] == pytest.approx(250.0)
    assert b0["beside_backward_ms"] == pytest.approx(200.0) and b0["after_backward_ms"] == pytest.approx(50.0)
    # bucket 1: two rounds summed (50 ms, not the 55 ms span), all of it after backward
    assert b1["wire_ms"] == pytest.approx(50.0) and b1["beside_backward_ms"] == pytest.approx(0.0)
    assert b1["after_backward_ms"] == pytest.approx(50.0) and b1["samples"] == 6
    line = describe_medians(top, b)
    assert "backward compute 300 ms, exposed communication 55 ms" in line
    assert "b0 250 ms (200 / 50), b1 50 ms (0 / 50)" in line


def test_built_in_sync_sgd_marks_no_collective_and_says_so():
    plain = docs()
    for d in plain:
        for it in d["iterations"]:
            it["spans"] = [s for s in it["spans"] if s["lane"] != "wire"]
            it["overlap"]["comm_exposed_s"] = None
    top, b = bucket_medians(plain)
    assert top["exposed_ms"] is None and b["wire_ms"].isna().all() and list(b["bucket"]) == [0, 1]
    assert "exposed communication n/a" in describe_medians(top, b) and "on the wire" not in describe_medians(top, b)


def test_the_report_writes_the_medians_beside_the_timeline(tmp_path):
    results = tmp_path / "results"
    trial = results / "trials" / ("a" * 16)
    trial.mkdir(parents=True)
    for d in docs():
        (trial / f"timeline_rank{d['rank']}.json").write_text(json.dumps(d))
    ok = pd.DataFrame([{"trial_id": "a" * 16, "attempt": 1, "compressor": "syncsgd", "compressor_options": "{}",
                        "serial": False, "overlap": True, "rate_bps": 0, "world_size": 2, "model": "cnn",
                        "timeline_iters": 3}])  # fmt: skip
    out = tmp_path / "report"
    out.mkdir()
    figures, notes = report_timelines(ok, results, out)
    assert notes == [] and len(figures) == 1
    caption, png = figures[0]
    assert png.is_file() and "backward compute 300 ms" in caption and f"timeline_{'a' * 16}.buckets.csv" in caption
    csv = pd.read_csv(out / f"timeline_{'a' * 16}.buckets.csv")
    assert list(csv.columns) == ["bucket", "ready_ms", "wire_start_ms", "wire_ms", "beside_backward_ms",
                                 "after_backward_ms", "samples"]  # fmt: skip
    assert csv["wire_ms"].tolist() == pytest.approx([250.0, 50.0])
