"""``python -m runners.train`` as 2 real processes with the torchrun environment, on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KEYS = {"rank", "iter", "forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s", "iter_time_s",
        "samples", "payload_bytes", "wire_tx_bytes", "wire_rx_bytes", "peer_wait_s",
        "comm_wire_s", "comm_hidden_s", "comm_exposed_s", "codec_critical_s", "codec_hidden_s"}  # fmt: skip
pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, world=2, timeout_s=120, env_drop=()):
    """Start ``world`` ranks; wait; kill (by process group) any rank still alive at the deadline."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
        for k in env_drop:
            env.pop(k, None)
        procs.append(subprocess.Popen([sys.executable, "-m", "runners.train", *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))  # fmt: skip
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout_s))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs, strict=True)]


def read_records(out: Path, world=2):
    return {r: [json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(world)}


@pytest.mark.parametrize(
    "compressor,extra,phases",
    [
        ("syncsgd", [], {"forward_s", "backward_s", "comm_s", "optimizer_s"}),
        ("acpsgd", ["--opt", "rank=2", "--overlap", "off"], {"forward_s", "backward_s", "encode_s", "comm_s",
                                                            "decode_s", "optimizer_s"}),  # fmt: skip
        ("powersgd", ["--opt", "rank=2", "--skew-probe"], {"forward_s", "backward_s", "encode_s", "comm_s", "decode_s",
                                           "optimizer_s"}),  # fmt: skip
        ("topk", ["--opt", "ratio=0.1", "--serial"], {"forward_s", "backward_s", "encode_s", "comm_s", "decode_s",
                                                      "optimizer_s"}),  # fmt: skip
    ],
)
def test_runner_records_phases_that_sum_to_iteration_time(tmp_path, compressor, extra, phases):
    out = tmp_path / "out"
    res = launch(["--model", "cnn", "--image-size", "16", "--batch-size", "8", "--compressor", compressor,
                  "--iters", "4", "--warmup-iters", "1", "--bucket-cap-mb", "0.001", "--iface", "lo",
                  "--threads", "1", "--out", str(out), *extra])  # fmt: skip
    for rc, _, err in res:
        assert rc == 0, err
        assert "train: rank" in err and " done: " in err
    recs = read_records(out)
    for rank, rows in recs.items():
        assert len(rows) == 4
        for i, row in enumerate(rows):
            assert set(row) == KEYS
            assert row["rank"] == rank and row["iter"] == i and row["samples"] == 8
            for k in ("forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s"):
                assert row[k] >= 0, (k, row)
                if k in phases:
                    assert row[k] > 0, (k, row)
            total = sum(row[k] for k in ("forward_s", "backward_s", "encode_s", "comm_s", "decode_s",
                                         "optimizer_s"))  # fmt: skip
            assert abs(total - row["iter_time_s"]) <= 0.05 * row["iter_time_s"], (total, row)
            assert row["payload_bytes"] > 0
            if "--skew-probe" in extra:  # the other rank's lateness, per collective: measured, small on loopback
                assert 0 <= row["peer_wait_s"] < row["iter_time_s"], row
            else:
                assert row["peer_wait_s"] is None
            assert row["wire_tx_bytes"] > 0 and row["wire_rx_bytes"] > 0  # loopback carried the collectives
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["compressor"] == compressor
    assert summary["config"]["overlap"] is ("off" not in extra)
    assert (summary["peer_wait_s"] is None) == ("--skew-probe" not in extra)
    assert summary["env"]["world_size"] == 2 and summary["env"]["backend"] == "gloo"
    assert summary["warmup_iters_used"] == (2 if compressor != "syncsgd" else 1)
    for k in ("iter_time_s_mean", "iter_time_s_p5", "iter_time_s_p50", "iter_time_s_p95", "samples_per_s",
              "forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s", "payload_bytes_per_iter",
              "wire_tx_bytes_per_iter", "wire_rx_bytes_per_iter"):  # fmt: skip
        assert summary[k] is not None and summary[k] >= 0, k
    assert summary["iter_time_s_p5"] <= summary["iter_time_s_p50"] <= summary["iter_time_s_p95"]
    dense = sum(4 * n for n in (16 * 3 * 9, 16, 32 * 16 * 9, 32, 10 * 32, 10))
    if compressor == "syncsgd":
        assert summary["payload_bytes_per_iter"] == dense
    else:
        assert summary["payload_bytes_per_iter"] < dense


def test_runner_no_timing_records_nulls(tmp_path):
    """One rank: --no-timing leaves out the per-phase clocks, whatever the world (2 ranks start twice the interpreters
    and torch for the same records)."""
    out = tmp_path / "out"
    res = launch(["--model", "mlp", "--batch-size", "4", "--iters", "2", "--warmup-iters", "0", "--no-timing",
                  "--threads", "1", "--out", str(out)], world=1)  # fmt: skip
    assert all(rc == 0 for rc, _, _ in res), res
    row = read_records(out, world=1)[0][0]
    assert row["forward_s"] is None and row["iter_time_s"] > 0


@pytest.mark.parametrize(
    "args,env_drop,needle",
    [
        (["--model", "mlp", "--compressor", "topk", "--opt", "ratio=1.5", "--out", "x"], (),
         "topk ratio 1.5 is outside (0, 1]"),
        (["--model", "mlp", "--out", "x"], ("MASTER_PORT", "RANK"), "missing environment variable(s) RANK"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, env_drop, needle):
    """As a real process (the other bad-input cases run in-process in tests/unit/runners/test_timing.py)."""
    (rc, out, err), = launch(args, world=1, timeout_s=60, env_drop=env_drop)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: ") and needle in lines[0], err
