"""One rank of `testbed calibrate`: all-reduce and all-gather microbenchmarks over message sizes (nccl-tests style),
plus a local probe of what a reduction costs this host per byte.

Started like a training rank (torchrun's environment, read with ``RankEnv``; argv built and parsed by
``runners.contract.CollBenchArgs``): gloo on CPU tensors, or NCCL on cuda:LOCAL_RANK.

Per message size n (bytes; the all-gather's *output*, each rank contributing n / p, as nccl-tests counts it) and per
collective, every timed repetition is: barrier, start the wall clock and the process CPU clock (all threads, user +
system: gloo's own threads and the kernel's socket work done on our behalf), the collective (and, on GPU, a
synchronise of the stream it ran on), stop both clocks. Rank 0 gathers every rank's times and writes one JSON file:

  wall_s: per repetition the slowest rank's wall time (a collective ends when its last rank is done)
  cpu_s:  per repetition the mean over ranks of the CPU time the rank's process spent (the host cost of the
          collective: what it takes from compute that runs beside it on the same cores)
  algbw_bps = 8n / median(wall_s);  busbw_bps = algbw x 2(p-1)/p (all-reduce), x (p-1)/p (all-gather)

the contention probe (the smallest and the largest size): training steps of a small CNN timed alone, then again while
a thread runs the collective back to back on every rank (see _stream_probe);
  wall_s: per repetition the slowest rank's median time of one collective of the stream (beside compute)
  stolen_s = (steps' time with the stream - alone) / collectives overlapped: compute each collective took from a rank;
the lockstep probe: the same training steps on every rank in lockstep (a barrier before each, as ranks synchronised
by their collectives are); per step the slowest rank's time minus the median rank's:
  skew_s: per step, how much later than the typical rank the slowest one is done (ranks time-sharing cores: the one
          that got its time slices last);
and the local probe: median seconds of ``x.add_(y)`` (a reduction) and ``x.copy_(y)`` over the largest size.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from datetime import timedelta

from runners.contract import COLLBENCH_SCHEMA, DEFAULT_PROBE_S, CollBenchArgs, ContractError, RankEnv
from runners.files import atomic_write
from runners.timing import lockstep_skew


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw: 2(p-1)/p for all-reduce, (p-1)/p for all-gather."""
    p = world_size
    return 2 * (p - 1) / p if collective == "allreduce" else (p - 1) / p


def probe_steps(probe_s: float, step_s: float) -> int:
    """Training steps per contention measurement: about `probe_s` of compute, 2-8 at the default --probe-s (as every
    stored calibration had), and down to 1 where a shorter --probe-s asks for less than two steps: the probe's steps
    are most of a calibration's time (about 26 steps of 0.9 s on a 2-core VM, whatever the sizes), so a quick
    calibration that asks for less gets less."""
    fewest = 2 if probe_s >= DEFAULT_PROBE_S else 1
    return max(fewest, min(8, int(probe_s / max(step_s, 1e-3))))


def _training_step(torch, device, sync):
    """The compute of the contention probe: one training step (forward, backward) of a small residual CNN, the
    memory-bound kind of work a collective competes with during a real backward (a small matmul stays in cache and
    under-counts it). Returns (step, seconds per step alone)."""
    import torch.nn as nn

    def block(c_in: int, c_out: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                             nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())  # fmt: skip

    net = nn.Sequential(block(3, 32, 1), block(32, 64, 2), block(64, 128, 2), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(128, 10)).to(device)  # fmt: skip
    xb = torch.randn(32, 3, 64, 64, device=device)
    yb = torch.randint(0, 10, (32,), device=device)

    def step() -> None:
        net.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(xb), yb).backward()
        sync()

    for _ in range(2):
        step()
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        runs.append(time.perf_counter() - t0)
    return step, statistics.median(runs)


def _stream_probe(dist, torch, device, step, steps: int, op, sync, barrier) -> tuple[float, float]:
    """`steps` training steps alone, then again while a thread keeps `op` (a collective) running back to back on
    every rank; returns (median seconds per collective, compute seconds each collective took from this rank):

        stolen per collective = (time with the stream - time alone) / collectives that overlapped the steps

    The ranks stop the stream together: before each collective they all-reduce (MAX) a flag that a rank sets when its
    steps are done, so every rank issues the same collectives in the same order (only the thread talks meanwhile)."""
    import threading

    barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    alone = time.perf_counter() - t0
    barrier()
    done = threading.Event()
    spans: list[tuple[float, float]] = []
    failed: list[BaseException] = []
    # CUDA: the stream of collectives runs on a CUDA stream of its own (after what the compute's stream made) and
    # each collective is timed by syncing that stream only; the steps sync only theirs (`sync`: the current stream)
    own = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    if own is not None:
        own.wait_stream(torch.cuda.current_stream(device))

    def stream() -> None:
        try:
            if own is not None:
                torch.cuda.set_device(device)  # the current device is per thread
            with torch.cuda.stream(own) if own is not None else contextlib.nullcontext():
                while True:
                    flag = torch.tensor([1.0 if done.is_set() else 0.0], device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    if flag.item() > 0:  # a copy on this stream, waited for: this stream only
                        return
                    s = time.perf_counter()
                    op()
                    sync()  # the current stream: this thread's own (so the tensors the compute's stream made are
                    spans.append((s, time.perf_counter()))  # free again when the thread ends: no record_stream)
        except BaseException as e:  # noqa: BLE001  re-raised in the main thread
            failed.append(e)

    thread = threading.Thread(target=stream, name="collbench-stream", daemon=True)
    thread.start()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    t1 = time.perf_counter()
    done.set()
    thread.join()
    if failed:
        raise failed[0]
    overlapped = sum(max(0.0, min(e, t1) - max(s, t0)) / (e - s) for s, e in spans if e > s)
    per_op = statistics.median(e - s for s, e in spans) if spans else 0.0
    stolen = max(0.0, (t1 - t0) - alone) / overlapped if overlapped > 0 else 0.0
    return per_op, stolen


def _lockstep_probe(step, steps: int, barrier) -> list[float]:
    """This rank's time of each of `steps` training steps, every one started together with the other ranks'."""
    times = []
    for _ in range(steps):
        barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def run(args: CollBenchArgs, env: RankEnv) -> dict:
    import torch
    import torch.distributed as dist

    if args.iface:
        if args.backend == "gloo":
            os.environ["GLOO_SOCKET_IFNAME"] = args.iface
        else:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "=" + args.iface)
            os.environ.setdefault("NCCL_IB_DISABLE", "1")
            os.environ.setdefault("NCCL_NET", "Socket")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            raise ContractError("--backend nccl needs CUDA, and no CUDA device is visible")
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=args.timeout_s),
                            device_id=device if device.type == "cuda" else None)  # fmt: skip
    p = env.world_size
    gather_op = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def sync() -> None:
        """Wait for the calling thread's current CUDA stream (never the whole device: the contention probe's
        collectives run on a stream of their own beside the compute)."""
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    def barrier() -> None:
        dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()

    def timed(op) -> tuple[float, float]:
        barrier()
        sync()
        w0, c0 = time.perf_counter(), time.process_time()
        op()
        sync()
        return time.perf_counter() - w0, time.process_time() - c0

    def collectives(size: int) -> tuple[int, dict]:
        """The message of `size` bytes (numel a multiple of p, so the all-gather's pieces are equal) and the two
        collectives on it: (numel, {name: op})."""
        numel = max(p, size // 4 // p * p)
        x = torch.ones(numel, dtype=torch.float32, device=device)
        out = torch.empty(numel, dtype=torch.float32, device=device)
        piece = x[: numel // p].clone()
        return numel, {"allreduce": lambda: dist.all_reduce(x), "allgather": lambda: gather_op(out, piece)}

    results = []
    try:
        for size in args.sizes_bytes:
            numel, ops = collectives(size)
            for name, op in ops.items():
                for _ in range(args.warmup):
                    op()
                times = [timed(op) for _ in range(args.reps)]
                results.append({"collective": name, "bytes": numel * 4, "times": times})
        # contention probe: how much compute a stream of collectives takes from training steps that run beside it
        # (gloo: copies, reductions and socket work on the same cores and caches; NCCL: the SMs and copy engines)
        # at the smallest and the largest size: the collective's own time beside compute gives a latency and a
        # per-byte slowdown; what it took from the compute, the host cost (largest size)
        step, step_s = _training_step(torch, device, sync)
        steps = probe_steps(args.probe_s, step_s)
        contention = []
        for size in sorted({min(args.sizes_bytes), max(args.sizes_bytes)}):
            numel, ops = collectives(size)
            for name, op in ops.items():
                times = [_stream_probe(dist, torch, device, step, steps, op, sync, barrier) for _ in range(args.reps)]
                contention.append({"collective": name, "bytes": numel * 4, "times": times})
        # every rank must run as many lockstep steps as the others (each barrier pairs up): the most any rank asks
        n_lockstep = torch.tensor([max(5, 2 * steps)], dtype=torch.int64, device=device)
        dist.all_reduce(n_lockstep, op=dist.ReduceOp.MAX)
        lockstep = _lockstep_probe(step, int(n_lockstep.item()), barrier)
        # local reduction / copy probe on the largest size (no communication)
        big = max(args.sizes_bytes) // 4
        a = torch.ones(big, dtype=torch.float32, device=device)
        b = torch.ones(big, dtype=torch.float32, device=device)
        local = {}
        for name, op in (("reduce", lambda: a.add_(b)), ("copy", lambda: a.copy_(b))):
            op()
            ts = []
            for _ in range(max(3, args.reps)):
                sync()
                t0 = time.perf_counter()
                op()
                sync()
                ts.append(time.perf_counter() - t0)
            local[name] = statistics.median(ts)
        gathered: list = [None] * p
        dist.all_gather_object(gathered, {"results": results, "local": local, "contention": contention,
                                          "lockstep": lockstep})  # fmt: skip
        barrier()
    finally:
        dist.destroy_process_group()
    if env.rank != 0:
        return {}
    rows = []
    for i, r in enumerate(results):
        per_rank = [g["results"][i]["times"] for g in gathered]
        wall = [max(t[k][0] for t in per_rank) for k in range(args.reps)]
        cpu = [statistics.fmean(t[k][1] for t in per_rank) for k in range(args.reps)]
        med = statistics.median(wall)
        algbw = 8 * r["bytes"] / med if med > 0 else float("inf")
        rows.append({"collective": r["collective"], "bytes": r["bytes"], "wall_s": wall, "cpu_s": cpu,
                     "algbw_bps": algbw, "busbw_bps": algbw * bus_factor(r["collective"], p)})  # fmt: skip
    stolen_rows = []
    for i, r in enumerate(contention):
        per_rank = [g["contention"][i]["times"] for g in gathered]
        stolen_rows.append({
            "collective": r["collective"],
            "bytes": r["bytes"],
            "wall_s": [max(t[k][0] for t in per_rank) for k in range(args.reps)],
            "stolen_s": [statistics.fmean(t[k][1] for t in per_rank) for k in range(args.reps)],
        })  # fmt: skip
    locals_ = [g["local"] for g in gathered]
    return {
        "schema": COLLBENCH_SCHEMA,
        "backend": args.backend,
        "device": device.type,
        "world_size": p,
        "threads": args.threads or torch.get_num_threads(),
        "torch_version": torch.__version__,
        "samples": rows,
        "contention": stolen_rows,
        "compute_chunk_s": step_s,
        "lockstep": {"skew_s": lockstep_skew([g["lockstep"] for g in gathered])},
        "local_probe": {
            "bytes": big * 4,
            "reduce_s": statistics.median(lp["reduce"] for lp in locals_),
            "copy_s": statistics.median(lp["copy"] for lp in locals_),
        },
    }


def main(argv: list[str] | None = None) -> int:
    try:
        args = CollBenchArgs.from_argv(sys.argv[1:] if argv is None else argv)
        env = RankEnv.from_environ(os.environ)
    except ContractError as e:
        print(f"collbench: error: {e}", file=sys.stderr)
        return 2
    data = run(args, env)
    if env.rank == 0:
        atomic_write(args.out, json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as runners.train: no C++ static destructors after the store server has gone
