"""Benchmark the compressor hooks on ResNet-50 and BERT-base gradient shapes; print Markdown tables.

    .venv/bin/python bench/compressors.py [--iters 3] [--device cpu|cuda|all] [--overlap on|off] [--skip-overhead]

1. Per compressor and model: encode and decode seconds per step (sum over DDP-like 25 MB buckets, median over
   iterations, after one unmeasured pass that fills error-feedback memory), payload bytes per step, and the
   compression ratio (dense fp32 bytes / payload). Gradients are random tensors of the models' parameter shapes.
   ``--overlap`` picks the hooks' mode (on: un-waited futures / powersgd's ordered worker; the arithmetic is the
   same, so encode/decode should match between modes; overlap itself shows only end to end, bench/end_to_end.py).
2. Our powersgd (overlap on and off, default and flavour=pytorch) vs PyTorch's powerSGD_hook, same rank (4), one
   bucket holding all of ResNet-50's gradients: wall time of the whole hook call until its future is done (world
   size 1, so the all-reduces cost ~nothing). Target: ratio <= 1.0.
3. acpsgd vs our powersgd: (encode + decode) ratio from table 1. Target: <= 0.6.
4. Timer overhead: ``python -m runners.train`` (1 rank) with per-phase timing on vs ``--no-timing``, interleaved
   runs, median of per-run mean iteration times. Target: <= 2 %.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runners import compressors as registry  # noqa: E402
from runners.compressors.base import FlatBucket  # noqa: E402
from runners.models import build  # noqa: E402
from runners.timing import Clock  # noqa: E402

CONFIGS = [
    ("syncsgd", {"builtin": False}),
    ("fp16", {}),
    ("bf16", {}),
    ("powersgd", {"rank": 4}),
    ("acpsgd", {"rank": 4}),
    ("signsgd", {}),
    ("topk", {"ratio": 0.01}),
    ("mstopk", {"ratio": 0.01}),
]


def buckets_of(model: str, device, cap_mb: float = 25.0):
    """DDP-like buckets: parameters in reverse order, closed when >= cap bytes. Returns [(shapes, numel)]."""
    spec = build(model, 1, device="cpu")
    params = [p for p in spec.module.parameters() if p.requires_grad][::-1]
    out, cur, size = [], [], 0
    for p in params:
        cur.append(tuple(p.shape))
        size += p.numel() * 4
        if size >= cap_mb * 2**20:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return [(shapes, sum(torch.Size(s).numel() for s in shapes)) for shapes in out]


def make_grads(buckets, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(device) for _, n in buckets]


def time_compressor(name, opts, buckets, grads, iters, device, overlap=True):
    state, hook = registry.get(name, overlap=overlap, **opts)
    clock = Clock(device)
    state.stats.clock = clock
    state.iter = state.warmup_iters
    enc, dec, payload = [], [], []
    for it in range(1 + iters):
        state.stats.reset()
        futs = [hook(state, FlatBucket(i, g.clone(), shapes, i == len(grads) - 1))
                for i, ((shapes, _), g) in enumerate(zip(buckets, grads, strict=True))]  # fmt: skip
        for f in futs:
            f.wait()
        clock.synchronize()
        s = state.stats.collect()
        if it:
            enc.append(s["encode_s"])
            dec.append(s["decode_s"])
            payload.append(s["payload_bytes"])
    state.close()
    return statistics.median(enc), statistics.median(dec), statistics.fmean(payload)


def ours_vs_pytorch(device, iters):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ptp

    ((shapes, n),) = [(sum((s for s, _ in buckets_of("resnet50", device)), []), 0)]
    n = sum(torch.Size(s).numel() for s in shapes)
    grad = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device)
    results = {}
    variants = {
        "ours": ({}, True),
        "ours overlap off": ({}, False),
        "ours flavour=pytorch": ({"flavour": "pytorch"}, True),
    }
    for label in (*variants, "pytorch"):
        if label in variants:
            extra, overlap = variants[label]
            state, hook = registry.get("powersgd", rank=4, start_iter=2, overlap=overlap, **extra)
        else:
            state = ptp.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                      min_compression_rate=2, use_error_feedback=True, warm_start=True)  # fmt: skip
            hook = ptp.powerSGD_hook
        times = []
        for it in range(3 + iters):  # 2 dense warm-up steps + 1 unmeasured compressed step
            fb = FlatBucket(0, grad.clone(), shapes, True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            hook(state, fb).wait()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if it >= 3:
                times.append(time.perf_counter() - t)
        results[label] = statistics.median(times)
        if label in variants:
            state.close()
    return results


def timer_overhead(runs: int, iters: int):
    """Mean iteration time of one loopback training rank with the per-phase timers on and off: the rank's argv is
    the contract's (RankArgs), started and watched by testbed.ranks like every other rank."""
    from runners.contract import RankArgs, torchrun_env
    from testbed import ranks

    def one(no_timing: bool):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as out:
            args = RankArgs(model="resnet18", out=out, compressor="powersgd", image_size=32, batch_size=16,
                            iters=iters, warmup_iters=3, backend="gloo", iface="lo", no_timing=no_timing)  # fmt: skip
            env = {**os.environ, **torchrun_env(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0,
                                                master_addr="127.0.0.1", master_port=port)}  # fmt: skip
            rank = ranks.Rank(ranks.THIS_MACHINE.host, [sys.executable, "-m", "runners.train", *args.to_argv()], env,
                              Path(out, "rank0.log"), REPO)  # fmt: skip
            with ranks.running(ranks.THIS_MACHINE, [rank]) as procs:
                watched = ranks.watch(procs, deadline=time.monotonic() + 600)
            if not watched.ok:
                raise SystemExit(f"timer-overhead rank failed: {Path(out, 'rank0.log').read_text()[-2000:]}")
            return json.loads(Path(out, "summary.json").read_text())["iter_time_s_mean"]

    on, off = [], []
    for _ in range(runs):
        on.append(one(False))
        off.append(one(True))
    return statistics.median(on), statistics.median(off)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="all", choices=("cpu", "cuda", "all"))
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--overlap", default="on", choices=("on", "off"), help="the hooks' mode for table 1")
    p.add_argument("--overhead-runs", type=int, default=3)
    args = p.parse_args(argv)
    devices = [torch.device("cpu")]
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices = [torch.device("cuda")] if args.device == "cuda" else devices + [torch.device("cuda")]
    tmp = tempfile.mkdtemp()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))  # fmt: skip
    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, devices: {[d.type for d in devices]}\n")
    print("| device | model | compressor | options | encode ms | decode ms | payload MB/step | ratio |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    table = {}
    for device in devices:
        for model in ("resnet50", "bert-base"):
            buckets = buckets_of(model, device)
            grads = make_grads(buckets, device)
            dense = 4 * sum(n for _, n in buckets)
            for name, opts in CONFIGS:
                enc, dec, pay = time_compressor(name, opts, buckets, grads, args.iters, device, args.overlap == "on")
                table[(device.type, model, name)] = (enc, dec)
                opt_s = ",".join(f"{k}={v}" for k, v in opts.items()) or "-"
                print(f"| {device.type} | {model} | {name} | {opt_s} | {enc * 1e3:.1f} | {dec * 1e3:.1f} | "
                      f"{pay / 1e6:.3f} | {dense / pay:.1f}x |", flush=True)  # fmt: skip
            del grads
    print("\n| device | hook, ResNet-50 in one bucket, rank 4 | ms per call |")
    print("|---|---|---:|")
    for device in devices:
        r = ours_vs_pytorch(device, args.iters)
        for label in ("ours", "ours overlap off", "ours flavour=pytorch"):
            print(f"| {device.type} | runners powersgd ({label}) | {r[label] * 1e3:.1f} |")
        print(f"| {device.type} | torch powerSGD_hook | {r['pytorch'] * 1e3:.1f} |")
        print(f"| {device.type} | **ratio ours / torch (target <= 1.0)** | **{r['ours'] / r['pytorch']:.2f}** |")
    print("\n| device | model | acpsgd (enc+dec) / powersgd (enc+dec), rank 4 (target <= 0.6) |")
    print("|---|---|---:|")
    for device in devices:
        for model in ("resnet50", "bert-base"):
            a = sum(table[(device.type, model, "acpsgd")])
            b = sum(table[(device.type, model, "powersgd")])
            print(f"| {device.type} | {model} | {a / b:.2f} |")
    dist.destroy_process_group()
    if not args.skip_overhead:
        on, off = timer_overhead(args.overhead_runs, 15)
        print("\n| runner (resnet18 32px, batch 16, powersgd, 1 rank, cpu) | mean iter s |")
        print("|---|---:|")
        print(f"| per-phase timing on | {on:.4f} |")
        print(f"| --no-timing | {off:.4f} |")
        print(f"| **overhead (target <= 2 %)** | **{(on / off - 1) * 100:+.1f} %** |")
    print(f"\n(total bench wall time {time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
