"""What a stored trial's figures say about its measurement (testbed/caveats.py): still warming up, the token
bucket's head start, and the report's line counting them."""

import math

from testbed.caveats import head_start_note, report_note, trial_notes, unsteady_note

TID = "0123456789abcdef"


def shaped_row(**extra):
    # PowerSGD, 2 hosts, 2 Mbit/s, 30 measured iterations: the measured row of the short run this warning comes from
    return {"trial_id": TID, "status": "ok", "rate_bps": 2_000_000, "burst_bytes": 65536, "wall_measured_s": 0.8346,
            "iters": 30, **extra}  # fmt: skip


def test_a_short_measurement_at_a_low_rate_is_told_the_buckets_head_start_and_how_many_iterations_bound_it():
    note = head_start_note(shaped_row())
    # 64 KB at 2 Mbit/s is 262 ms, 31 % of 0.83 s; 5 % needs 30 x 31.4 / 5 -> 189 iterations
    assert note.startswith(f"warning: trial {TID} measured 0.83 s of steps at 2mbit")
    assert "(262 ms of data at the rate)" in note and "up to 31 % low" in note
    assert "--iters 189 or more (was 30)" in note
    assert trial_notes(shaped_row()) == [note]


def test_no_head_start_warning_where_the_bucket_is_small_against_the_measurement_or_there_is_none():
    assert head_start_note(shaped_row(wall_measured_s=6.19, iters=200)) is None  # 262 ms is 4.2 % of 6.2 s
    assert head_start_note(shaped_row(rate_bps=1_000_000_000)) is None  # 64 KB at 1 Gbit/s: 0.5 ms
    assert head_start_note(shaped_row(rate_bps=0, burst_bytes=None)) is None  # unshaped
    assert head_start_note(shaped_row(status="failed")) is None  # a failure says why itself
    assert head_start_note({"trial_id": TID, "status": "ok"}) is None  # a row of an older testbed


def test_a_straggler_links_longer_head_start_is_the_one_told():
    # every link at 1 Gbit/s (125 KB: 1 ms) but h1 at 2 Mbit/s with its default bucket (two frames: 12 ms)
    fast = {"rate_bps": 1_000_000_000, "burst_bytes": 125_000, "wall_measured_s": 0.1}
    note = head_start_note(shaped_row(**fast, min_host_rate_bps=2_000_000))
    assert note is not None and "at 2mbit" in note and "(12 ms of data at the rate)" in note
    assert head_start_note(shaped_row(**fast, min_host_rate_bps=1_000_000_000)) is None


def test_a_trial_still_warming_up_is_flagged():
    row = {"trial_id": TID, "status": "ok", "warmup_iters": 2}
    note = unsteady_note({**row, "settle_ratio": 1.43})
    assert note.startswith(f"warning: trial {TID} was still warming up") and "1.43x" in note
    assert "--warmup-iters (was 2)" in note
    assert unsteady_note({**row, "settle_ratio": 1.05}) is None  # steady within 10 %
    assert unsteady_note(row) is None  # fewer than 4 measured steps, or a row of an older testbed
    assert unsteady_note({**row, "settle_ratio": math.nan}) is None  # the same, as pandas loads it
    assert unsteady_note({**row, "status": "failed", "settle_ratio": 2.0}) is None  # a failure says why itself


def test_the_report_counts_each_warning_with_a_few_ids_and_reads_rows_as_pandas_loads_them():
    rows = [shaped_row(trial_id=f"{i:016x}") for i in range(5)]
    rows.append({**shaped_row(trial_id="f" * 16, wall_measured_s=60.0), "settle_ratio": 1.5, "warmup_iters": 2})
    rows.append({**shaped_row(trial_id="e" * 16, wall_measured_s=60.0), "settle_ratio": math.nan,
                 "min_host_rate_bps": math.nan})  # fmt: skip
    note = report_note(rows)
    assert "1 still warming up (ffffffffffffffff)" in note
    assert "5 token-bucket head start above 5 % (0000000000000000, 0000000000000001, 0000000000000002 and 2 more)" in note
    assert report_note(rows[-1:]) is None
