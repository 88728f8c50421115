"""Page faults a training step takes in the first model a process trains and in a later one, per compressor: why the
co-located profile measures each compressor in processes of its own (testbed.modelling.measure_lockstep).

    python bench/first_model_faults.py                                  # resnet18 bs8, every built-in compressor
    python bench/first_model_faults.py --compressors acpsgd,fp16 --models 3

One process, a world-size-1 gloo group on a file store, torch with one thread: for each compressor, `--models`
models trained one after another in this process (each a fresh DDP model with the compressor's hook, `--steps`
steps), and per model the median over its steps after `--skip` of the minor page faults (getrusage) taken during
forward, backward and the optimizer, in a process of its own per compressor (this script starts one each). A count,
not a time; but a compressor with a worker thread or callbacks (PowerSGD, signSGD, MSTop-K) faults more or less with
the threads' timing, so what else runs moves its counts (PowerSGD's first model: 150 quiet, 7,500 beside a sitting).
Prints a Markdown table (docs/benchmarks.md has the run)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import timedelta

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(compressor: str, model: str, batch_size: int, models: int, steps: int, skip: int) -> list[dict]:
    """In this process: per model trained, the median faults per step in each phase."""
    import resource

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors as registry
    from runners.compressors import attach
    from runners.models import build, make_optimizer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gcfaults-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                timeout=timedelta(seconds=120))  # fmt: skip

        def faults() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        out = []
        for _ in range(models):
            state, hook = registry.get(compressor)
            spec = build(model, batch_size, image_size=64, seq_len=128, device=torch.device("cpu"))
            ddp = DDP(spec.module, bucket_cap_mb=25, gradient_as_bucket_view=True)
            attach(ddp, state, hook)
            opt = make_optimizer(ddp.parameters(), 1e-3)
            per: dict[str, list[int]] = {"forward": [], "backward": [], "optimizer": []}
            for step in range(steps):
                x, y = spec.make_batch(step)
                a = faults()
                loss = spec.loss_fn(ddp(x), y)
                b = faults()
                loss.backward()
                c = faults()
                opt.step()
                opt.zero_grad(set_to_none=False)
                d = faults()
                if step >= skip:
                    for key, n in (("forward", b - a), ("backward", c - b), ("optimizer", d - c)):
                        per[key].append(n)
            out.append({k: statistics.median(v) for k, v in per.items()})
            close = getattr(state, "close", None)
            if close is not None:
                close()
            del ddp, spec, opt
        dist.destroy_process_group()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--compressors", default="syncsgd,fp16,bf16,powersgd,acpsgd,signsgd,topk,mstopk")
    ap.add_argument("--models", type=int, default=2, help="models trained one after another in each process (>= 2)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=4, help="steps not counted (the compressors' warm-up)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this compressor here, print JSON
    args = ap.parse_args()
    if args.models < 2 or args.steps <= args.skip or args.skip < 0 or args.batch_size < 1:
        print("first_model_faults: error: --models must be >= 2, --steps > --skip >= 0, --batch-size >= 1 "
              f"(got {args.models}, {args.steps}, {args.skip}, {args.batch_size})", file=sys.stderr)  # fmt: skip
        return 2
    if args.one:
        print(json.dumps(measure(args.one, args.model, args.batch_size, args.models, args.steps, args.skip)))
        sys.stdout.flush()
        os._exit(0)  # as runners/train.py: no C++ static destructors after a compressor's worker thread
    print(f"{args.model} bs{args.batch_size}: median minor page faults a step (backward), {args.steps - args.skip} "
          f"steps after {args.skip}, per model trained in one process\n")  # fmt: skip
    print("| compressor | " + " | ".join(f"model {i + 1}" for i in range(args.models)) + " | forward, optimizer |")
    print("|---|" + "---|" * (args.models + 1))
    for name in args.compressors.split(","):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--model", args.model,
                               "--batch-size", str(args.batch_size), "--models", str(args.models), "--steps",
                               str(args.steps), "--skip", str(args.skip)],
                              capture_output=True, text=True, cwd=REPO, timeout=600)  # fmt: skip
        if done.returncode != 0:
            print(f"first_model_faults: error: {name}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        other = max(max(r["forward"], r["optimizer"]) for r in rows)
        print(f"| {name} | " + " | ".join(f"{r['backward']:.0f}" for r in rows) + f" | at most {other:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
