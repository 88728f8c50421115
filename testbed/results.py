"""The results store: one row per trial, Parquet, appended atomically.

Layout of a results directory:
    results/
      rows/<trial_id>.parquet   one file per trial, written to a temp name then renamed (atomic: a crash never
                                leaves a half-written row; a trial id appears once, so no row is ever duplicated)
      trials/<trial_id>/        the ranks' records (rank<r>.jsonl), summary.json and logs/rank<r>.log
`load_results(dir)` reads every row into one DataFrame; `export_csv` writes it as CSV. The columns and their units
are documented in docs/results-format.md; SCHEMA_VERSION changes whenever a column changes meaning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from testbed.errors import InputError

SCHEMA_VERSION = 1

# name -> pyarrow type; the order is the column order of the store
COLUMNS: dict[str, pa.DataType] = {
    "schema_version": pa.int32(),
    "trial_id": pa.string(),
    "status": pa.string(),  # ok | failed | timeout
    "error": pa.string(),
    "started_at": pa.string(),  # ISO 8601, UTC
    "wall_s": pa.float64(),
    "backend": pa.string(),  # local | lab
    "cluster_name": pa.string(),
    "host_count": pa.int32(),
    "world_size": pa.int32(),
    "rate_bps": pa.int64(),  # requested link rate; 0 = unshaped
    "burst_bytes": pa.int64(),
    "qdisc": pa.string(),
    "delay_s": pa.float64(),
    "measured_goodput_bps": pa.float64(),  # iperf3 probe right before the trial
    "ideal_goodput_bps": pa.float64(),
    "model": pa.string(),
    "batch_size": pa.int32(),
    "image_size": pa.int32(),
    "seq_len": pa.int32(),
    "compressor": pa.string(),
    "compressor_options": pa.string(),  # JSON object
    "iters": pa.int32(),
    "warmup_iters": pa.int32(),  # as run (raised to cover the compressor's own start-up steps)
    "seed": pa.int32(),
    "serial": pa.bool_(),
    "bucket_cap_mb": pa.float64(),
    "torch_version": pa.string(),
    "python_version": pa.string(),
    "kernel": pa.string(),
    "dist_backend": pa.string(),  # gloo | nccl
    "device": pa.string(),
    "testbed_version": pa.string(),
    "hostname": pa.string(),
    "iter_time_s_mean": pa.float64(),
    "iter_time_s_p5": pa.float64(),
    "iter_time_s_p50": pa.float64(),
    "iter_time_s_p95": pa.float64(),
    "samples_per_s": pa.float64(),
    "forward_s": pa.float64(),
    "backward_s": pa.float64(),
    "encode_s": pa.float64(),
    "comm_s": pa.float64(),
    "decode_s": pa.float64(),
    "optimizer_s": pa.float64(),
    "payload_bytes_per_iter": pa.float64(),
    "wire_tx_bytes_per_iter": pa.float64(),
    "wire_rx_bytes_per_iter": pa.float64(),
}
SCHEMA = pa.schema(list(COLUMNS.items()))


class ResultsStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise InputError(f"--out {self.root}: is a file; expected a directory for results (it is created)")

    @property
    def rows_dir(self) -> Path:
        return self.root / "rows"

    def trial_dir(self, trial_id: str) -> Path:
        return self.root / "trials" / trial_id

    def ensure(self) -> None:
        try:
            self.rows_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--out {self.root}: cannot create ({e.strerror})") from None

    def append(self, row: dict[str, Any]) -> Path:
        """Write one trial's row atomically (temp file + rename); a later row with the same id replaces it."""
        self.ensure()
        full = {name: row.get(name) for name in COLUMNS}
        full["schema_version"] = SCHEMA_VERSION
        table = pa.Table.from_pylist([full], schema=SCHEMA)
        final = self.rows_dir / f"{row['trial_id']}.parquet"
        tmp = self.rows_dir / f".{row['trial_id']}.{os.getpid()}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(final)
        return final

    def stored_ids(self, status: str | None = "ok") -> set[str]:
        df = self.load(missing_ok=True)
        if df.empty:
            return set()
        if status is not None:
            df = df[df["status"] == status]
        return set(df["trial_id"])

    def load(self, missing_ok: bool = False) -> pd.DataFrame:
        files = sorted(self.rows_dir.glob("*.parquet")) if self.rows_dir.is_dir() else []
        if not files:
            if missing_ok:
                return pd.DataFrame(columns=list(COLUMNS))
            if not self.root.exists():
                raise InputError(f"results directory {self.root} does not exist; run `testbed run` or `sweep` first")
            raise InputError(f"results directory {self.root} holds no trials; run `testbed run --out {self.root}`")
        tables = [pq.read_table(f) for f in files]
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()

    def find(self, trial_id: str) -> dict[str, Any] | None:
        path = self.rows_dir / f"{trial_id}.parquet"
        if not path.exists():
            return None
        return pq.read_table(path).to_pylist()[0]


def load_results(path: str | Path) -> pd.DataFrame:
    """Every stored trial of a results directory as one DataFrame (columns as in COLUMNS)."""
    return ResultsStore(path).load()


def export_csv(path: str | Path, out: str | Path) -> Path:
    df = load_results(path)
    out = Path(out)
    df.to_csv(out, index=False)
    return out
