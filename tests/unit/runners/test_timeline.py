"""The overlap split and the lanes of runners/timeline.py on hand-made marks (a clock whose marks are seconds), and
the report's Chrome-trace export and figure on the result. No root, no ranks (tests/integration/test_timeline.py
runs the real thing)."""

from __future__ import annotations

import json

import pytest

from runners.timeline import iteration_record, subtract, union
from runners.timing import CommStats


class SecondsClock:
    """Marks are plain seconds handed in by the test."""

    cuda = False
    enabled = True

    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def seconds(self, a, b):
        return b - a


def _stats(events) -> CommStats:
    """events: (t, call, args...) replayed in time order on a CommStats with the seconds clock."""
    clock = SecondsClock()
    stats = CommStats(clock)
    open_marks = {}
    for t, call, *args in sorted(events, key=lambda e: e[0]):
        clock.t = t
        if call == "start":
            open_marks[args[0]] = stats.start()
        elif call == "stop":
            phase, index, key, *crit = args
            stats.stop(phase, index, open_marks.pop(key), *crit)
        elif call == "end_hook":
            stats.end_hook()
        else:
            getattr(stats, call)(*args)
    return stats


def _record(stats, **kw):
    phases = {"encode_s": kw.pop("encode_s"), "decode_s": kw.pop("decode_s")}
    return iteration_record(stats.clock, stats, serial=kw.pop("serial", False), t0=0.0, phases=phases, builtin=False,
                            **kw)  # fmt: skip


def test_span_arithmetic():
    assert union([(0, 1), (0.5, 2), (3, 4)]) == [(0, 2), (3, 4)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]


def test_overlapped_bucket_hides_what_backward_covers():
    # forward 0-1; backward 1-5 (last gradient at 4); bucket 0 ready at 2, encodes 2-2.5, its all-reduce 2.5-4.5
    # (un-waited, done in a callback that decodes 4.5-4.7); the hook returns at 2.6; DDP waits 4-5 for it
    stats = _stats([
        (2.0, "mark", "ready", 0), (2.0, "start", "e"), (2.5, "stop", "encode", 0, "e"),
        (2.5, "before_collective", 0), (2.6, "end_hook"), (2.6, "mark", "returned", 0),
        (4.5, "collective_done", 0), (4.5, "start", "d"), (4.7, "stop", "decode", 0, "d", False),
    ])  # fmt: skip
    rec = _record(stats, t1=1.0, t2=5.0, t_red=5.0, t3=5.5, last_grad=4.0, encode_s=0.5, decode_s=0.2)
    ov = rec["overlap"]
    # busy: backward 1-4 outside the hook (1-2, 2.6-4) plus the encode 2-2.5; the wire 2.5-4.5 meets it on 2.6-4
    assert ov["comm_wire_s"] == pytest.approx(2.0)
    assert ov["comm_hidden_s"] == pytest.approx(1.4)
    assert ov["comm_exposed_s"] == pytest.approx(0.6)
    assert rec["comm_exposed_spans"] == [[pytest.approx(2.5), pytest.approx(2.6)], [pytest.approx(4.0), 4.5]]
    assert ov["codec_critical_s"] == pytest.approx(0.7) and ov["codec_hidden_s"] == pytest.approx(0.0)
    lanes = {(s["lane"], s["name"]) for s in rec["spans"]}
    assert {("compute", "forward"), ("compute", "backward"), ("codec", "encode"), ("wire", "collective"),
            ("wait", "wait")} <= lanes  # fmt: skip
    assert rec["hooks"] == [[2.0, 2.6]]
    # the training thread's lanes (compute, wait, hook calls) cover the whole iteration: forward, backward to the last
    # gradient, the hook inside it, DDP's wait 4-5, the optimizer 5-5.5
    assert _thread_cover(rec) == [(0.0, 5.5)]


def test_a_waited_collective_hides_nothing():
    # --overlap off: the hook waits on its collective (2.5-4), decodes in the hook
    stats = _stats([
        (2.0, "mark", "ready", 0), (2.0, "start", "e"), (2.5, "stop", "encode", 0, "e"), (2.5, "before_collective", 0),
        (2.5, "start", "w"), (4.0, "stop", "comm", 0, "w"), (4.0, "start", "d"), (4.2, "stop", "decode", 0, "d"),
        (4.2, "end_hook"), (4.2, "mark", "returned", 0),
    ])  # fmt: skip
    rec = _record(stats, t1=1.0, t2=4.5, t_red=4.5, t3=5.0, last_grad=1.9, encode_s=0.5, decode_s=0.2)
    assert rec["overlap"]["comm_hidden_s"] == 0.0 and rec["overlap"]["comm_exposed_s"] == pytest.approx(1.5)
    assert [s["waited"] for s in rec["spans"] if s["lane"] == "wire"] == [True]
    # covered but for the gap between the last gradient (1.9) and the hook's first mark (2.0): adjacent marks, which a
    # real rank takes microseconds apart (a preemption between them is the only way that gap grows)
    assert _thread_cover(rec) == [(0.0, 1.9), (2.0, 5.0)]


def _thread_cover(rec) -> list[tuple[float, float]]:
    thread = [(s["start_s"], s["end_s"]) for s in rec["spans"] if s["lane"] in ("compute", "wait")]
    return [(round(a, 9), round(b, 9)) for a, b in union(thread + [tuple(h) for h in rec["hooks"]])]


def test_chrome_trace_and_figure(tmp_path):
    from matplotlib.image import imread

    from testbed.report.timeline import chrome_trace, median_iteration, plot_timeline

    stats = _stats([(2.0, "mark", "ready", 0), (2.0, "before_collective", 0), (3.0, "collective_done", 0)])
    rec = _record(stats, t1=1.0, t2=3.5, t_red=3.5, t3=4.0, last_grad=3.2, encode_s=0.0, decode_s=0.0)
    docs = [{"format": "testbed-timeline", "rank": r, "clock_offset_s": 0.5 * r,
             "iterations": [{**rec, "iter": 0, "t0_wall_s": 100.0 + 0.5 * r, "iter_time_s": 4.0}]}
            for r in range(2)]  # fmt: skip
    trace = chrome_trace(docs)
    json.dumps(trace)  # serialisable
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1}
    # rank 1's clock is 0.5 s ahead: after alignment both iterations start at ts 0
    assert sorted(e["ts"] for e in xs if e["name"] == "iteration 0") == [0.0, 0.0]
    assert all(e["dur"] >= 0 and isinstance(e["tid"], int) for e in xs)
    assert median_iteration(docs) == 0
    img = imread(plot_timeline(docs, 0, tmp_path / "t.png", "unit"))
    assert img.ndim == 3 and img.shape[1] > 600
