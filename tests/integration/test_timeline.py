"""`--timeline N` and `--trace N` on real emulated hosts with real gloo ranks (root), and the report's timeline.

Two trials of ACP-SGD on 2 hosts (mlp, tiny buckets so that the model has several, 2 kept iterations each), overlap on
and off, share one cluster; the report is built once from both. About 40 s on 2 cores.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.root

TRIAL = ["--model", "mlp", "--batch-size", "8", "--iters", "3", "--warmup-iters", "2", "--no-probe",
         "--compressor", "acpsgd", "--opt", "rank=2", "--bucket-cap-mb", "0.001", "--bw", "50mbit",
         "--timeline", "2"]  # fmt: skip
TOL_S = 1e-6  # the row's and the file's numbers come from the same marks: only float rounding separates them


def _union(spans):
    out = []
    for a, b in sorted(tuple(s) for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans) -> float:
    return sum(b - a for a, b in _union(spans))


def _timelines(trial_dir: Path) -> list[dict]:
    docs = [json.loads((trial_dir / f"timeline_rank{r}.json").read_text()) for r in range(2)]
    for d in docs:
        assert d["format"] == "testbed-timeline" and len(d["iterations"]) == 2, d.keys()
    return docs


def _check_ordered_and_covering(doc: dict) -> None:
    """Per bucket: ready <= encode start, encode end <= its collective's issue, collective done <= decode start; the
    spans lie within the iteration and the training thread's lanes (compute, wait, hook calls) cover it."""
    for it in doc["iterations"]:
        spans, points = it["spans"], it["points"]
        ready = {p["bucket"]: p["t_s"] for p in points if p["name"] == "bucket ready"}
        buckets = sorted(ready)
        assert len(buckets) >= 2, f"tiny buckets should give the mlp several: {buckets}"
        for b in buckets:
            enc = [s for s in spans if s["lane"] == "codec" and s["name"] == "encode" and s["bucket"] == b]
            wire = [s for s in spans if s["lane"] == "wire" and s["bucket"] == b]
            dec = [s for s in spans if s["lane"] == "codec" and s["name"] == "decode" and s["bucket"] == b]
            assert len(enc) == 1 and len(wire) == 1 and len(dec) == 1, (b, enc, wire, dec)
            assert ready[b] <= enc[0]["start_s"] <= enc[0]["end_s"] <= wire[0]["start_s"], (b, ready[b], enc, wire)
            assert wire[0]["start_s"] <= wire[0]["end_s"] <= dec[0]["start_s"] <= dec[0]["end_s"], (b, wire, dec)
        end = max(s["end_s"] for s in spans if s["lane"] == "compute" and s["name"] == "optimizer")
        assert end <= it["iter_time_s"]  # t0 after the iteration clock's start, t3 before its end: no tolerance
        assert all(0.0 <= s["start_s"] <= s["end_s"] <= end for s in spans), "a span outside the iteration"
        # the training thread's lanes (compute, wait, hook calls) run from the iteration's start to its end; what
        # they leave uncovered lies between adjacent marks (last gradient -> the hook's first mark), microseconds on a
        # quiet machine but a whole preemption on a loaded one (2.6 ms of 23.7 seen), so it is not bounded here: that
        # the lanes cover the iteration exactly is tests/unit/runners/test_timeline.py's, on hand-made marks
        cover = _union([(s["start_s"], s["end_s"]) for s in spans if s["lane"] in ("compute", "wait")] + it["hooks"])
        assert cover[0][0] == 0.0 and cover[-1][1] == end, cover
        assert {s["name"] for s in spans if s["lane"] == "compute"} == {"forward", "backward", "optimizer"}


def _check_split(doc: dict) -> float:
    """hidden + exposed == the union of the collectives, per kept iteration; returns the hidden time summed."""
    hidden = 0.0
    for it in doc["iterations"]:
        ov = it["overlap"]
        wire = [(s["start_s"], s["end_s"]) for s in it["spans"] if s["lane"] == "wire"]
        assert abs(_length(wire) - ov["comm_wire_s"]) <= TOL_S
        assert abs(_length(it["comm_exposed_spans"]) - ov["comm_exposed_s"]) <= TOL_S
        assert abs(ov["comm_hidden_s"] + ov["comm_exposed_s"] - ov["comm_wire_s"]) <= TOL_S
        assert ov["comm_hidden_s"] >= 0 and ov["codec_critical_s"] > 0 and ov["codec_hidden_s"] >= 0
        hidden += ov["comm_hidden_s"]
    return hidden


def _check_chrome_trace(trace: dict) -> None:
    """The Chrome trace event format as Perfetto/chrome://tracing read it: traceEvents with ph/ts/dur/pid/tid."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in ("X", "i", "M") and isinstance(e["name"], str), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int | float) and e["ts"] >= 0 and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["ts"] >= 0 and e["s"] in ("t", "p", "g"), e
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"forward", "backward", "optimizer", "exposed communication"} <= names
    assert any(n.startswith("collective b") for n in names) and any(n.startswith("encode b") for n in names)


def test_timeline_trace_and_report_on_two_hosts(make_cluster, testbed_cli, tmp_path):
    from testbed.results import load_results

    name = make_cluster(2)
    out = tmp_path / "res"
    on = testbed_cli("run", "--name", name, "--out", str(out), *TRIAL, "--trace", "1", timeout_s=240)
    assert on.returncode == 0, on.stdout[-800:] + on.stderr[-800:]
    off = testbed_cli("run", "--name", name, "--out", str(out), *TRIAL, "--overlap", "off", timeout_s=240)
    assert off.returncode == 0, off.stdout[-800:] + off.stderr[-800:]
    df = load_results(out).set_index("overlap")
    assert (df["status"] == "ok").all() and (df["timeline_iters"] == 2).all()
    assert df.loc[True, "trace_iters"] == 1 and df.loc[False, "trace_iters"] == 0
    for overlap, row in df.iterrows():
        assert abs(row["comm_hidden_s"] + row["comm_exposed_s"] - row["comm_wire_s"]) <= TOL_S, overlap
        assert row["codec_critical_s"] == pytest.approx(row["encode_s"] + row["decode_s"], abs=TOL_S)
    trial_on, trial_off = (out / "trials" / df.loc[o, "trial_id"] for o in (True, False))

    # overlap on: ordered marks, the split adds up, some communication hidden behind backward
    hidden_on = 0.0
    for doc in _timelines(trial_on):
        _check_ordered_and_covering(doc)
        hidden_on += _check_split(doc)
    # Load-proof form of "ACP-SGD hides communication": with several buckets, a collective issued from a hook is in
    # flight while backward computes the next bucket (its all-reduce needs a round trip over the shaped link), so
    # the hidden time is > 0; how much depends on the machine's load, so no fraction is asserted.
    assert hidden_on > 0 and df.loc[True, "comm_hidden_s"] > 0
    # overlap off: every collective is waited in its hook, so nothing is hidden, exactly
    for doc in _timelines(trial_off):
        _check_ordered_and_covering(doc)
        assert _check_split(doc) == 0.0
    assert df.loc[False, "comm_hidden_s"] == 0.0

    # --trace 1: torch.profiler's Chrome trace per rank, with the testbed's phases as ranges
    for r in range(2):
        trace = json.loads((trial_on / f"trace_rank{r}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"testbed.forward", "testbed.backward", "testbed.optimizer"} <= names, sorted(names)[:20]
        assert any("all_reduce" in (n or "") for n in names), "no collective in the profile"
    assert not list(trial_off.glob("trace_rank*.json"))

    # the report: every variant's timeline (PNG + Chrome trace) and `--timeline TRIAL_ID`
    rep = tmp_path / "rep"
    done = testbed_cli("report", str(out), "--out", str(rep), "--timeline", df.loc[False, "trial_id"], "--json")
    assert done.returncode == 0, done.stderr[-800:]
    figures = [Path(f) for f in json.loads(done.stdout)["figures"]]
    html = (rep / "report.html").read_text()
    for tid in df["trial_id"]:
        png = rep / f"timeline_{tid}.png"
        assert png in figures
        import matplotlib.image as mpimg

        img = mpimg.imread(png)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600
        assert f"trial {tid}" in html and base64.b64encode(png.read_bytes()).decode("ascii") in html
        _check_chrome_trace(json.loads((rep / f"timeline_{tid}.trace.json").read_text()))
        # the per-bucket medians over every kept iteration of both ranks: each bucket's collectives on the wire
        medians = pd.read_csv(rep / f"timeline_{tid}.buckets.csv")
        assert len(medians) >= 2 and (medians["wire_ms"] > 0).all() and (medians["samples"] == 4).all(), medians
        assert (medians["beside_backward_ms"] <= medians["wire_ms"] + 1e-6).all()
        assert "backward compute" in html and f"timeline_{tid}.buckets.csv" in html

    bad = testbed_cli("report", str(out), "--out", str(tmp_path / "rep2"), "--timeline", "0123456789abcdef")
    assert bad.returncode == 2 and "--timeline 0123456789abcdef" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / "rep2").exists()  # refused before the report made its directory or drew a figure


def test_timeline_flag_bad_input(testbed_cli, tmp_path):
    for flags, said in ((["--timeline", "5", "--iters", "3"], "--timeline 5"), (["--trace", "-1"], "--trace -1")):
        done = testbed_cli("run", "--name", "tnone", "--bw", "none", "--model", "mlp", "--out", str(tmp_path / "r"), *flags)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
