"""Where an iteration goes, on one rank: the marks of its phases, buckets, codec work and collectives, and the
split of communication into the part backward hid and the part it left exposed.

The runner takes the marks it already takes (``runners.timing.CommStats``: encode/decode/comm intervals per bucket,
plus the point marks "ready", "issue" and "done") and turns them, per measured iteration, into

* ``overlap_split(...)``: five numbers for the results row (every measured iteration, whenever timing is on):
  ``comm_wire_s``     the union of this rank's collectives' spans, issue to completion (time on the wire);
  ``comm_hidden_s``   the part of it during which the training thread did backward's work: computing gradients
                      (outside the hooks) or encoding in a hook: communication that cost no time. Time inside a
                      hook that is not encode (issuing a collective that blocks, an in-hook wait) hides nothing;
  ``comm_exposed_s``  the rest (``comm_wire_s - comm_hidden_s``): during the tail wait after backward, an in-hook
                      wait (``--overlap off``), the serial reduction (``--serial``), or the optimizer;
  ``codec_critical_s`` encode + decode on the critical path (the phases' ``encode_s + decode_s``);
  ``codec_hidden_s``  codec work that ran off it (a future callback's decode while backward still computed).
  Built-in syncsgd has no hook, so no collective marks: its comm columns are null.
* ``iteration_record(...)``: the spans of one iteration (seconds from its start) in four lanes: ``compute``
  (forward, backward compute, optimizer), ``codec`` (encode, decode; ``critical`` false when off the training
  thread), ``wire`` (one span per collective; ``waited`` true when the training thread blocked on it) and ``wait``
  (the training thread blocked: in-hook waits, the tail, the serial reduction's waits); the point marks (bucket
  ready, end of backward compute); the spans of exposed communication and of the hook calls; the overlap numbers. ``write(...)`` stores the kept iterations as
  ``timeline_rank<r>.json`` (format: docs/results-format.md, "Timeline").
"""

from __future__ import annotations

import json
import os

from runners.files import atomic_write

FORMAT = "testbed-timeline"
VERSION = 1
LANES = ("compute", "codec", "wire", "wait")
OVERLAP_KEYS = ("comm_wire_s", "comm_hidden_s", "comm_exposed_s", "codec_critical_s", "codec_hidden_s")

Span = tuple[float, float]


def marking_hook(hook):
    """``hook`` between two point marks: "ready" (DDP handed the bucket over) and "returned" (``CommStats.mark``)."""

    def marked_hook(state, bucket):
        index = bucket.index()
        state.stats.mark("ready", index)
        fut = hook(state, bucket)
        state.stats.mark("returned", index)
        return fut

    return marked_hook


# ------------------------------------------------------------------------------------------------ span arithmetic
def union(spans) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans) -> float:
    return sum(b - a for a, b in union(spans))


def intersect(xs, ys) -> list[Span]:
    out = []
    for a, b in union(xs):
        for c, d in union(ys):
            lo, hi = max(a, c), min(b, d)
            if hi > lo:
                out.append((lo, hi))
    return out


def subtract(xs, ys) -> list[Span]:
    out = union(xs)
    for c, d in union(ys):
        nxt = []
        for a, b in out:
            if d <= a or c >= b:
                nxt.append((a, b))
                continue
            if c > a:
                nxt.append((a, c))
            if d < b:
                nxt.append((d, b))
        out = nxt
    return out


# ------------------------------------------------------------------------------------------------ one iteration
def collectives(marks, rel) -> list[dict]:
    """Pair each bucket's "issue" marks with its "done" marks in order: one dict per collective."""
    issued: dict[int, list] = {}
    done: dict[int, list] = {}
    for kind, index, mark, waited in marks:
        if mark is None:
            continue
        if kind == "issue":
            issued.setdefault(index, []).append(rel(mark))
        elif kind == "done":
            done.setdefault(index, []).append((rel(mark), waited))
    out = []
    for index, starts in issued.items():
        for k, start in enumerate(starts):
            if k < len(done.get(index, ())):
                end, waited = done[index][k]
                out.append({"bucket": index, "seq": k, "start_s": start, "end_s": max(end, start), "waited": waited})
    return sorted(out, key=lambda c: c["start_s"])


def hook_spans(marks, rel) -> list[Span]:
    """[ready, returned] of every hook call (pairs in order per bucket)."""
    ready: dict[int, list] = {}
    spans = []
    for kind, index, mark, _w in marks:
        if mark is None:
            continue
        if kind == "ready":
            ready.setdefault(index, []).append(rel(mark))
        elif kind == "returned" and ready.get(index):
            spans.append((ready[index].pop(0), rel(mark)))
    return spans


class MarkSnapshot:
    """One iteration's marks, kept by reference for ``iteration_record`` after the measured loop: ``--timeline`` then
    adds no work between iterations (``CommStats.reset`` makes new lists, so these stay as they were)."""

    __slots__ = ("marks", "intervals", "hook_end")

    def __init__(self, marks, intervals, hook_end) -> None:
        self.marks, self.intervals, self.hook_end = marks, intervals, hook_end

    @classmethod
    def of(cls, stats) -> MarkSnapshot:
        return cls(stats.marks, stats.intervals, stats.hook_end)


def keep_iteration(kept, iteration: int, t0_wall_s: float, iter_time_s: float, peer_wait_s, marks: dict,
                   stats) -> None:  # fmt: skip
    """All that ``--timeline`` does inside the measured loop (runners/train.py): the iteration's numbers and its raw
    marks, by reference, appended to ``kept`` (a deque of the last N); bench/timeline_overhead.py times this call."""
    kept.append((iteration, t0_wall_s, iter_time_s, peer_wait_s, marks, MarkSnapshot.of(stats)))


def iteration_record(clock, stats, *, serial: bool, t0, t1, t2, t_red, t3, last_grad, phases: dict,
                     builtin: bool, spans: bool = True) -> dict:  # fmt: skip
    """This iteration's overlap numbers (``"overlap"``) and, with ``spans``, its lanes and point marks, in seconds
    from ``t0`` (the iteration's first mark). Call after the device is synchronised."""

    def rel(mark):
        return clock.seconds(t0, mark)

    f_end, b_end, red_end, opt_end = rel(t1), rel(t2), rel(t_red), rel(t3)
    colls = collectives(stats.marks, rel)
    codec = [(ph, i, rel(a), rel(b), crit) for ph, i, a, b, crit in stats.intervals if ph in ("encode", "decode")]
    in_hook_waits = [(rel(a), rel(b)) for ph, _i, a, b, crit in stats.intervals if ph == "comm" and crit]
    if serial:
        compute_end = b_end
        busy = [(f_end, b_end)]  # no_sync backward: nothing is on the wire while it computes
        encode_spans = [(a, b) for ph, _i, a, b, _c in codec if ph == "encode"]
        blocked = subtract([(b_end, red_end)], encode_spans)
    else:
        compute_end = min(max(rel(last_grad), f_end), b_end) if last_grad is not None else b_end
        tail_start = compute_end
        if stats.hook_end is not None:
            tail_start = max(tail_start, min(rel(stats.hook_end), b_end))
        waited = [(c["start_s"], c["end_s"]) for c in colls if c["waited"]] + in_hook_waits
        blocked = union(waited + [(tail_start, b_end)])
        in_hooks = hook_spans(stats.marks, rel)
        encode_in_hooks = [(a, b) for ph, _i, a, b, crit in codec if ph == "encode" and crit]
        busy = subtract(union(subtract([(f_end, tail_start)], in_hooks) + encode_in_hooks), waited)
        busy = intersect(busy, [(f_end, tail_start)])
    wire = union((c["start_s"], c["end_s"]) for c in colls)
    if builtin or not colls:  # built-in syncsgd (no hook), or a plugin whose collectives are not marked
        comm = {"comm_wire_s": None, "comm_hidden_s": None, "comm_exposed_s": None}
    else:
        hidden = length(intersect(wire, busy))
        total = length(wire)
        comm = {"comm_wire_s": total, "comm_hidden_s": hidden, "comm_exposed_s": total - hidden}
    critical = (phases.get("encode_s") or 0.0) + (phases.get("decode_s") or 0.0)
    codec_total = sum(b - a for _ph, _i, a, b, _c in codec)
    overlap = {**comm, "codec_critical_s": critical, "codec_hidden_s": max(0.0, codec_total - critical)}
    if not spans:
        return {"overlap": overlap}
    lanes: list[dict] = [
        {"lane": "compute", "name": "forward", "start_s": 0.0, "end_s": f_end},
        {"lane": "compute", "name": "backward", "start_s": f_end, "end_s": compute_end},
        {"lane": "compute", "name": "optimizer", "start_s": red_end, "end_s": opt_end},
    ]
    lanes += [{"lane": "codec", "name": ph, "bucket": i, "start_s": a, "end_s": b, "critical": crit}
              for ph, i, a, b, crit in codec]  # fmt: skip
    lanes += [{"lane": "wire", "name": "collective", **c} for c in colls]
    lanes += [{"lane": "wait", "name": "serial reduction" if serial else "wait", "start_s": a, "end_s": b}
              for a, b in blocked]  # fmt: skip
    points = [{"name": "bucket ready", "bucket": i, "t_s": rel(m)} for kind, i, m, _w in stats.marks
              if kind == "ready" and m is not None]  # fmt: skip
    points.append({"name": "backward compute end", "t_s": compute_end})
    exposed = subtract(wire, busy) if comm["comm_wire_s"] is not None else []
    return {
        "iter_time_s": opt_end,
        "backward_window_s": [f_end, compute_end],
        "comm_exposed_spans": [list(x) for x in exposed],
        "hooks": [list(x) for x in hook_spans(stats.marks, rel)],  # [ready, returned] of each hook call
        "spans": lanes,
        "points": points,
        "overlap": overlap,
    }


def write(out_dir: str, rank: int, world: int, offsets_s: list[float], iterations: list[dict], facts: dict) -> str:
    """Store the kept iterations of this rank as ``timeline_rank<rank>.json``; returns its path."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "rank": rank,
        "world_size": world,
        "clock_offset_s": offsets_s[rank] if offsets_s else 0.0,
        **facts,
        "iterations": iterations,
    }
    path = os.path.join(out_dir, f"timeline_rank{rank}.json")
    atomic_write(path, json.dumps(doc, separators=(",", ":")) + "\n")
    return path
