"""One rank of the all-reduce bus-bandwidth benchmark (started by bench/end_to_end.py and bench/gpu_check.py).

gloo on CPU tensors, or NCCL on cuda:LOCAL_RANK (`--backend nccl`, socket settings from the environment).

Prints one JSON line from rank 0: size, repetitions, mean seconds per all-reduce, algbw and busbw in bit/s
(busbw = algbw x 2(n-1)/n, the nccl-tests convention).
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--bytes", type=int, default=64 * 2**20)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--iface", default="eth0")
p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
p.add_argument("--fail-at-init", action="store_true", help=argparse.SUPPRESS)  # the GPU check's fail-fast test
args = p.parse_args()
if args.fail_at_init:
    print(f"allreduce_rank {os.environ.get('RANK')}: exiting 3 at init (--fail-at-init)", flush=True)
    sys.exit(3)
os.environ.setdefault("GLOO_SOCKET_IFNAME", args.iface)
device = torch.device("cpu")
if args.backend == "nccl":
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout_s))
n = dist.get_world_size()
x = torch.ones(args.bytes // 4, dtype=torch.float32, device=device)
dist.all_reduce(x)  # warm-up: connections established
times = []
for _ in range(args.reps):
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    mean_s = sum(times) / len(times)
    algbw = args.bytes * 8 / mean_s
    print(json.dumps({"bytes": args.bytes, "reps": args.reps, "world_size": n, "mean_s": mean_s,
                      "algbw_bps": algbw, "busbw_bps": algbw * 2 * (n - 1) / n}), flush=True)
dist.destroy_process_group()
