"""The results store never loses a measurement: attempts are kept apart, unreadable rows are skipped by name."""

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from testbed.errors import InputError
from testbed.results import COLUMNS, ResultsStore, best_attempts, load_results

TID = "0123456789abcdef"


def row(status="ok", trial_id=TID, iter_time=1.0, **extra):
    return {"trial_id": trial_id, "status": status, "iter_time_s_mean": iter_time, "compressor": "syncsgd", **extra}


def test_a_failed_attempt_never_replaces_an_ok_one(tmp_path):
    store = ResultsStore(tmp_path / "res")
    first = store.append(row("ok", iter_time=1.5))
    second = store.append(row("failed", iter_time=None, error="interrupted (Ctrl-C)"))
    assert first.name == f"{TID}.parquet" and second.name == f"{TID}.2.parquet"
    assert first.exists() and second.exists()
    best = load_results(tmp_path / "res")
    assert len(best) == 1
    assert best.iloc[0]["status"] == "ok" and best.iloc[0]["iter_time_s_mean"] == 1.5
    assert best.iloc[0]["attempt"] == 1
    every = store.load(all_attempts=True)
    assert sorted(zip(every["attempt"], every["status"], strict=True)) == [(1, "ok"), (2, "failed")]
    assert store.find(TID)["attempt"] == 1
    assert store.stored_ids("ok") == {TID}


def test_rerun_keeps_both_and_shows_the_latest_ok(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(row("ok", iter_time=1.0))
    store.append(row("ok", iter_time=2.0))
    store.append(row("timeout", iter_time=None))
    assert store.find(TID)["iter_time_s_mean"] == 2.0
    assert len(store.load(all_attempts=True)) == 3


def test_trial_dir_reserves_the_attempt_its_row_gets(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.trial_dir(TID) == tmp_path / "trials" / TID
    store.append(row("failed"))
    again = ResultsStore(tmp_path)
    d = again.trial_dir(TID)
    assert d == tmp_path / "trials" / f"{TID}.2"
    assert again.trial_dir(TID) == d  # the same attempt until its row is stored
    assert again.append(row("ok")).name == f"{TID}.2.parquet"
    # an attempt killed before its row (records only) still owns its number
    (tmp_path / "trials" / f"{TID}.3").mkdir(parents=True)
    assert ResultsStore(tmp_path).next_attempt(TID) == 4


def test_best_attempt_rule():
    rows = [
        {"trial_id": "a", "status": "failed", "attempt": 1},
        {"trial_id": "a", "status": "ok", "attempt": 2},
        {"trial_id": "a", "status": "failed", "attempt": 3},
        {"trial_id": "b", "status": "failed", "attempt": 1},
        {"trial_id": "b", "status": "timeout", "attempt": 2},
    ]
    best = best_attempts(rows)
    assert best["a"]["attempt"] == 2 and best["b"]["attempt"] == 2


def test_rows_of_old_stores_without_attempt_column_are_attempt_one(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    pq.write_table(
        pa.Table.from_pylist([{"trial_id": TID, "status": "ok", "schema_version": 1}]), rows / f"{TID}.parquet"
    )
    df = load_results(tmp_path)
    assert df.iloc[0]["attempt"] == 1 and list(df.columns) == list(COLUMNS)
    assert ResultsStore(tmp_path).append(row("failed")).name == f"{TID}.2.parquet"


@pytest.mark.parametrize(
    "damage",
    ["truncated", "garbage", "empty", "directory", "wrong-columns", "dangling-link"],
)
def test_an_unreadable_row_is_reported_by_name_and_skipped(tmp_path, damage):
    store = ResultsStore(tmp_path)
    good = store.append(row("ok", trial_id="aaaaaaaaaaaaaaaa"))
    bad = store.rows_dir / "bbbbbbbbbbbbbbbb.parquet"
    if damage == "truncated":
        data = good.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        bad.write_bytes(os.urandom(300))
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "directory":
        bad.mkdir()
    elif damage == "wrong-columns":
        pq.write_table(pa.Table.from_pylist([{"x": 1}]), bad)
    else:
        bad.symlink_to(tmp_path / "gone.parquet")
    warnings = []
    df = store.load(warn=warnings.append)
    assert list(df["trial_id"]) == ["aaaaaaaaaaaaaaaa"]
    assert len(warnings) == 1 and str(bad) in warnings[0] and "\n" not in warnings[0]
    assert store.stored_ids("ok", warn=warnings.append) == {"aaaaaaaaaaaaaaaa"}


def test_only_unreadable_rows_is_an_input_error(tmp_path):
    store = ResultsStore(tmp_path)
    store.rows_dir.mkdir()
    (store.rows_dir / f"{TID}.parquet").write_bytes(b"nope")
    with pytest.raises(InputError, match="no readable trials"):
        store.load(warn=lambda _m: None)
    assert store.load(missing_ok=True, warn=lambda _m: None).empty


def test_writability_checked_up_front(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(InputError, match="is a file"):
        ResultsStore(a_file)
    with pytest.raises(InputError, match="parent directory .* does not exist"):
        ResultsStore(tmp_path / "no" / "res").check_writable()
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "rows").write_text("not a dir")
    with pytest.raises(InputError, match="rows is not a directory"):
        ResultsStore(tmp_path / "res").check_writable()
    ResultsStore(tmp_path / "new").check_writable()
    assert not (tmp_path / "new").exists()  # the check creates nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "res"]


def test_a_row_without_the_settle_ratio_still_loads(tmp_path):
    """(The warning it raises: tests/unit/testbed/test_caveats.py.)"""
    store = ResultsStore(tmp_path / "res")
    store.append(row(settle_ratio=1.43))
    store.append(row(trial_id="fedcba9876543210"))  # an older row: no settle_ratio
    loaded = load_results(tmp_path / "res").set_index("trial_id")
    assert loaded.loc[TID, "settle_ratio"] == 1.43 and pd.isna(loaded.loc["fedcba9876543210", "settle_ratio"])
