"""The results store: one row per attempt of a trial, Parquet, appended atomically, never overwritten.

Layout of a results directory:
    results/
      rows/<trial_id>.parquet     attempt 1 of a trial: one row, written to a temp name, fsynced, then linked into
                                  place (a crash never leaves a half-written row)
      rows/<trial_id>.<n>.parquet attempt n >= 2 (a rerun, a resumed sweep re-running a failed trial)
      trials/<trial_id>/          the ranks' records of attempt 1 (rank<r>.jsonl), summary.json, logs/rank<r>.log
      trials/<trial_id>.<n>/      the same for attempt n
An attempt's row is never replaced: a failed or interrupted attempt cannot destroy an ok one. `load_results(dir)`
returns the best attempt per trial id (the latest ok one, else the latest one); `load(all_attempts=True)` every
attempt. A row file that cannot be read (truncated, garbage, no permission) is reported by name on stderr and skipped.
The columns and their units are documented in docs/results-format.md; SCHEMA_VERSION changes whenever a column
changes meaning.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from testbed.errors import InputError

if TYPE_CHECKING:  # pandas (~0.6 s to import) only when rows are loaded: every CLI command starts without it
    import pandas as pd

SCHEMA_VERSION = 6  # 2: placement (ranks per host, NCCL settings), overlap, peer skew, GPU/NCCL versions; 3: learning;
# 4: where a trial's wall time goes (wall_*_s) and how DDP's model sync ran (model_sync); 5: cluster shapes (issue 36);
# 6: the default token bucket is 1 ms of data, at least two frames (was at least 64 KB; shaped trials with the default
# bucket have new ids), loaded_rtt_s

# name -> pyarrow type; the order is the column order of the store
COLUMNS: dict[str, pa.DataType] = {
    "schema_version": pa.int32(),
    "trial_id": pa.string(),
    "attempt": pa.int32(),  # 1, 2, ...: every run of a trial id is kept (missing in old stores: from the file name)
    "status": pa.string(),  # ok | failed | timeout | interrupted
    "error": pa.string(),
    "started_at": pa.string(),  # ISO 8601, UTC
    "wall_s": pa.float64(),
    # where wall_s goes (schema 4; null in older rows): the controller's steps, then rank 0's life inside wall_ranks_s
    "wall_shape_s": pa.float64(),  # shaping the links (from the trial's start)
    "wall_probe_s": pa.float64(),  # the iperf3 check (0 with --no-probe) and the loaded-RTT pings (cross traffic)
    "wall_ranks_s": pa.float64(),  # the ranks' start to their exit
    "wall_teardown_s": pa.float64(),  # fetching records, ending the ranks, restoring the shaping
    "wall_rank_start_s": pa.float64(),  # rank 0: its module loaded to every rank ready with its model
    "wall_model_sync_s": pa.float64(),  # rank 0: DDP's construction (the model broadcast, or the checksum)
    "wall_warmup_s": pa.float64(),  # rank 0: the warm-up steps
    "wall_measured_s": pa.float64(),  # rank 0: the measured steps
    "model_sync": pa.string(),  # checksum (every rank built the same model: no broadcast) | broadcast
    "backend": pa.string(),  # local | lab
    "cluster_name": pa.string(),
    "host_count": pa.int32(),  # hosts the trial ran on
    "ranks_per_host": pa.int32(),  # torchrun's nproc-per-node
    "world_size": pa.int32(),  # ranks in all = host_count x ranks_per_host
    "rate_bps": pa.int64(),  # requested link rate; 0 = unshaped
    "burst_bytes": pa.int64(),
    "qdisc": pa.string(),
    "delay_s": pa.float64(),
    # cluster shapes (schema 5, issue 36; null in older rows): testbed/trial_shape.py, testbed/cross_traffic.py
    "jitter_s": pa.float64(),  # netem delay variation
    "loss_pct": pa.float64(),  # netem packet loss
    "host_rates": pa.string(),  # JSON {host: rate_bps or null}: --host-bw links over rate_bps (null: none)
    "min_host_rate_bps": pa.int64(),  # the slowest host link of the trial (0: every link unshaped)
    "cross_traffic": pa.int32(),  # bulk iperf3 --bidir flows running for the trial's length
    "cross_traffic_pairs": pa.string(),  # their host pairs, e.g. "h0<->h2,h1<->h3"
    "loaded_rtt_s": pa.float64(),  # RTT to the ring neighbour while the cross traffic ran (null: none, or no ping)
    "racks": pa.int32(),  # racks of the cluster (1: one switch)
    "uplink_bps": pa.int64(),  # each rack's spine link (null: no racks or an unshaped spine)
    "oversubscription": pa.float64(),  # the worst rack's host rates over its uplink
    "measured_goodput_bps": pa.float64(),  # iperf3 probe right before the trial
    "probe_duration_s": pa.float64(),  # that probe's length (null: not probed)
    "probe_streams": pa.int32(),  # and its TCP streams (one iperf3 process each before iperf3 3.16)
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
    "overlap": pa.bool_(),  # hooks return un-waited futures (communication overlaps backward)
    "skew_probe": pa.bool_(),
    "bucket_cap_mb": pa.float64(),
    "torch_version": pa.string(),
    "python_version": pa.string(),
    "kernel": pa.string(),
    "dist_backend": pa.string(),  # gloo | nccl
    "intra_host": pa.string(),  # p2p | socket (NCCL between GPUs of one host)
    "nccl_settings": pa.string(),  # JSON object: the NCCL_* variables every rank got
    "user_env_keys": pa.string(),  # comma-separated names of --env variables (values are never stored)
    "device": pa.string(),  # cpu | cuda
    "device_name": pa.string(),  # GPU name, or the CPU
    "cuda_version": pa.string(),
    "nccl_version": pa.string(),
    "driver_version": pa.string(),
    "testbed_version": pa.string(),
    "hostname": pa.string(),
    # co-location (schema 5, issue 32; null in older rows and on lab hosts): the machine's cores, each rank's threads,
    # and "N ranks share M cores" when the emulated hosts' ranks x threads exceed them (null: they do not share)
    "cores": pa.int32(),
    "threads_per_rank": pa.int32(),
    "colocation": pa.string(),
    "iter_time_s_mean": pa.float64(),
    "iter_time_s_p5": pa.float64(),
    "iter_time_s_p50": pa.float64(),
    "iter_time_s_p95": pa.float64(),
    "settle_ratio": pa.float64(),  # first two measured steps over the last two (~1: steady; null: < 4 steps)
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
    "peer_wait_s": pa.float64(),  # --skew-probe: waiting for the slowest peer per iteration (else null)
    # the overlap split (issue 35, runners/timeline.py; comm columns null for built-in syncsgd): per iteration
    "comm_wire_s": pa.float64(),  # union of this rank's collectives, issue to completion
    "comm_hidden_s": pa.float64(),  # the part of it while backward computed or a hook encoded
    "comm_exposed_s": pa.float64(),  # the rest: comm_wire_s - comm_hidden_s
    "codec_critical_s": pa.float64(),  # encode + decode on the critical path (encode_s + decode_s)
    "codec_hidden_s": pa.float64(),  # codec work off it (a callback's decode while backward computed)
    "timeline_iters": pa.int32(),  # --timeline N: iterations whose marks are in trials/<id>/timeline_rank<r>.json
    "trace_iters": pa.int32(),  # --trace N: torch.profiler iterations in trials/<id>/trace_rank<r>.json
    # MODULE:FACTORY plugins (null for built-in compressors)
    "plugin_module": pa.string(),
    "plugin_version": pa.string(),  # the module's __version__ or its distribution's version, when it has one
    "plugin_sha256": pa.string(),  # of the module's source file, as the controller (and every host) had it
    "plugin_path": pa.string(),  # the directory given with --plugin-path (the ranks' PYTHONPATH)
    "plugin_assumed": pa.string(),  # what the model assumed because the state did not declare it
    # learning (issue 33; null for synthetic trials): data, evaluation, target, the curve
    "data": pa.string(),  # synthetic | fashion-mnist | cifar10:DIR | imagefolder:DIR
    "lr": pa.float64(),  # the learning rate given (null: the runner's default)
    "eval_every": pa.int32(),  # steps between evaluations on the test split
    "target_accuracy": pa.float64(),
    "max_steps": pa.int32(),
    "steps_run": pa.int32(),  # training steps taken (warm-up included)
    "train_time_s": pa.float64(),  # sum of the training steps' wall times (evaluation excluded)
    "eval_time_s": pa.float64(),  # evaluation wall time, summed over the evaluations (kept apart)
    "eval_samples": pa.int32(),  # test samples scored at the last evaluation, all ranks together
    "final_test_loss": pa.float64(),
    "final_test_accuracy": pa.float64(),
    "reached_target": pa.bool_(),  # null without a target
    "steps_to_target": pa.int32(),  # the first evaluated step at or above the target (null: never reached)
    "train_time_to_target_s": pa.float64(),  # training time up to that step
    "curve": pa.string(),  # JSON list of {step, train_time_s, train_loss, test_loss, test_accuracy, eval_s, eval_samples}
}
SCHEMA = pa.schema(list(COLUMNS.items()))


PENDING_ROW = "row.pending.json"  # a row kept in its trial directory when the store could not take it
ROW_FILE = re.compile(r"^(?P<id>[^.]+?)(?:\.(?P<attempt>[0-9]+))?\.parquet$")
Warn = Callable[[str], None]


def warn_stderr(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


class ResultsStore:
    def __init__(self, root: str | Path, *, flag: str = "--out"):
        self.root = Path(root)
        self.flag = flag
        if self.root.exists() and not self.root.is_dir():
            raise InputError(f"{flag} {self.root}: is a file; expected a directory for results (it is created)")
        self._reserved: dict[str, int] = {}  # trial id -> attempt number handed out by trial_dir()

    @property
    def rows_dir(self) -> Path:
        return self.root / "rows"

    def row_path(self, trial_id: str, attempt: int) -> Path:
        return self.rows_dir / (f"{trial_id}.parquet" if attempt == 1 else f"{trial_id}.{attempt}.parquet")

    def attempt_dir(self, trial_id: str, attempt: int) -> Path:
        return self.root / "trials" / (trial_id if attempt == 1 else f"{trial_id}.{attempt}")

    def trial_dir(self, trial_id: str) -> Path:
        """The directory for the attempt about to run, created here: the next attempt number is reserved by making
        its directory (mkdir without exist_ok, so two processes with the same results directory never get one
        number), and `append()` of a row with this trial id stores it under the same number (earlier attempts'
        records are never touched)."""
        if trial_id not in self._reserved:
            attempt = self.next_attempt(trial_id)
            (self.root / "trials").mkdir(parents=True, exist_ok=True)
            while True:
                try:
                    self.attempt_dir(trial_id, attempt).mkdir()
                    break
                except FileExistsError:  # another process reserved this number meanwhile: take the next one
                    attempt += 1
            self._reserved[trial_id] = attempt
        return self.attempt_dir(trial_id, self._reserved[trial_id])

    def reserved_attempt(self, trial_id: str) -> int | None:
        return self._reserved.get(trial_id)

    def attempts(self, trial_id: str) -> dict[int, Path]:
        """Attempt number -> row file, for the stored attempts of one trial."""
        out = {}
        if self.rows_dir.is_dir():
            for p in self.rows_dir.glob(f"{glob_escape(trial_id)}*.parquet"):
                m = ROW_FILE.match(p.name)
                if m and m["id"] == trial_id:
                    out[int(m["attempt"] or 1)] = p
        return dict(sorted(out.items()))

    def next_attempt(self, trial_id: str) -> int:
        used = set(self.attempts(trial_id))
        trials = self.root / "trials"
        if trials.is_dir():  # an attempt killed before its row was written still owns its records
            for p in trials.glob(f"{glob_escape(trial_id)}*"):
                m = ROW_FILE.match(p.name + ".parquet")
                if m and m["id"] == trial_id:
                    used.add(int(m["attempt"] or 1))
        return max(used, default=0) + 1

    def check_writable(self) -> None:
        """InputError now (before a trial starts) when rows could not be stored at its end."""
        from testbed.outputs import check_output_dir

        check_output_dir(self.root, self.flag, subdirs=("rows", "trials"))

    def ensure(self) -> None:
        try:
            self.rows_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{self.flag} {self.root}: cannot create ({e.strerror})") from None

    def append(self, row: dict[str, Any], *, attempt: int | None = None) -> Path:
        """Store one attempt's row atomically (temp file, fsync, hard link: an existing attempt is never replaced).
        The attempt number is `attempt`, else the one `trial_dir()` reserved for this trial id, else the next free
        one. OSError (a full or read-only file system) leaves the reservation in place for a later try."""
        self.ensure()
        trial_id = row["trial_id"]
        attempt = attempt or self._reserved.get(trial_id) or self.next_attempt(trial_id)
        tmp = self.rows_dir / f".{trial_id}.{os.getpid()}.tmp"
        try:
            while True:
                full = {name: row.get(name) for name in COLUMNS}
                full["schema_version"] = SCHEMA_VERSION
                full["attempt"] = attempt
                pq.write_table(pa.Table.from_pylist([full], schema=SCHEMA), tmp)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                final = self.row_path(trial_id, attempt)
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    attempt += 1  # another process stored this attempt meanwhile: take the next number
                    continue
                except OSError:  # a file system without hard links
                    if final.exists():
                        attempt += 1
                        continue
                    tmp.replace(final)
                row["attempt"] = attempt
                self._reserved.pop(trial_id, None)
                return final
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    # ---------------------------------------------------------------------------------------- rows stored later
    def pending_path(self, trial_id: str, attempt: int) -> Path:
        """Where a row that could not be stored waits (in its attempt's directory) for `store_pending()`."""
        return self.attempt_dir(trial_id, attempt) / PENDING_ROW

    def keep_pending(self, row: dict[str, Any], attempt: int) -> Path:
        """Write a row that `append` could not store beside its attempt's records, as JSON; returns the path."""
        from shaping.files import atomic_write

        row = {**row, "attempt": attempt}
        return atomic_write(self.pending_path(row["trial_id"], attempt), json.dumps(row, default=str, indent=1))

    def store_pending(self) -> list[Path]:
        """Store every row kept by `keep_pending` (`testbed results DIR --store-pending`) at its own attempt number,
        then remove its JSON; returns the row files written."""
        stored = []
        for path in sorted((self.root / "trials").glob(f"*/{PENDING_ROW}")) if (self.root / "trials").is_dir() else []:
            try:
                row = json.loads(path.read_text())
                trial_id, attempt = row["trial_id"], int(row["attempt"])
            except (ValueError, KeyError, TypeError) as e:
                raise InputError(f"{path}: not a kept row ({type(e).__name__}: {e}); move it away") from None
            if path.parent != self.attempt_dir(trial_id, attempt):
                raise InputError(f"{path}: names trial {trial_id} attempt {attempt}, not its directory's; move it away")
            if attempt in self.attempts(trial_id):
                path.unlink()  # stored already (an earlier --store-pending stopped before removing it)
                continue
            stored.append(self.append(row, attempt=attempt))
            path.unlink()
        return stored

    def stored_ids(self, status: str | None = "ok", warn: Warn = warn_stderr) -> set[str]:
        """Trial ids whose best attempt has `status` (any status when None)."""
        df = self.load(missing_ok=True, warn=warn)
        if df.empty:
            return set()
        if status is not None:
            df = df[df["status"] == status]
        return set(df["trial_id"])

    def read_rows(self, warn: Warn = warn_stderr) -> list[dict[str, Any]]:
        """Every readable attempt row; unreadable files are reported through `warn` by name and skipped."""
        files = sorted(self.rows_dir.glob("*.parquet")) if self.rows_dir.is_dir() else []
        rows = []
        for f in files:
            m = ROW_FILE.match(f.name)
            try:
                table = pq.read_table(f)
                if table.num_rows != 1 or "trial_id" not in table.column_names or "status" not in table.column_names:
                    raise ValueError(f"{table.num_rows} rows, columns {', '.join(table.column_names[:5])}...")
                row = table.to_pylist()[0]
                if row.get("attempt") is None:
                    row["attempt"] = int(m["attempt"] or 1) if m else 1
                pa.Table.from_pylist([{name: row.get(name) for name in COLUMNS}], schema=SCHEMA)  # types fit
            except (OSError, ValueError, TypeError, pa.ArrowException) as e:
                reason = " ".join(str(e).split())[:160] or type(e).__name__
                warn(f"skipped unreadable results row {f} ({type(e).__name__}: {reason}); move it away or delete it")
                continue
            rows.append(row)
        return rows

    def load(self, missing_ok: bool = False, *, all_attempts: bool = False, warn: Warn = warn_stderr) -> pd.DataFrame:
        """The best attempt per trial id (the latest ok attempt, else the latest attempt); every attempt with
        `all_attempts`. Unreadable row files are reported through `warn` and skipped."""
        import pandas as pd

        rows = self.read_rows(warn)
        if not rows:
            if missing_ok:
                return pd.DataFrame(columns=list(COLUMNS))
            if not self.root.exists():
                raise InputError(f"results directory {self.root} does not exist; run `testbed run` or `sweep` first")
            if self.rows_dir.is_dir() and any(self.rows_dir.glob("*.parquet")):
                raise InputError(f"results directory {self.root} holds no readable trials (see the warnings above)")
            raise InputError(f"results directory {self.root} holds no trials; run `testbed run --out {self.root}`")
        if not all_attempts:
            rows = list(best_attempts(rows).values())
        table = pa.Table.from_pylist([{name: r.get(name) for name in COLUMNS} for r in rows], schema=SCHEMA)
        return table.to_pandas()

    def find(self, trial_id: str, warn: Warn = warn_stderr) -> dict[str, Any] | None:
        """The best stored attempt of one trial, or None."""
        rows = []
        for attempt, path in self.attempts(trial_id).items():
            try:
                row = pq.read_table(path).to_pylist()[0]
            except (OSError, ValueError, IndexError, pa.ArrowException) as e:
                warn(f"skipped unreadable results row {path} ({type(e).__name__}); move it away or delete it")
                continue
            row["attempt"] = row.get("attempt") or attempt
            rows.append(row)
        return best_attempts(rows).get(trial_id)


def best_attempts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """trial id -> its best attempt: the latest ok one, else the latest one."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        old = best.get(r["trial_id"])
        key = (r.get("status") == "ok", r.get("attempt") or 1)
        if old is None or key > (old.get("status") == "ok", old.get("attempt") or 1):
            best[r["trial_id"]] = r
    return best


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def load_results(path: str | Path, *, all_attempts: bool = False) -> pd.DataFrame:
    """Every stored trial of a results directory as one DataFrame (columns as in COLUMNS), its best attempt each."""
    return ResultsStore(path).load(all_attempts=all_attempts)


def export_csv(path: str | Path, out: str | Path) -> Path:
    df = load_results(path)
    out = Path(out)
    df.to_csv(out, index=False)
    return out
