"""One rank of `testbed check-compressor`: a small DDP job that exercises a compressor the way training does, under
per-rank random delays, and writes what it saw to ``OUT/rank{r}.json`` (``OUT/rank{r}.stage`` tells how far it got, so
a hang can be reported with the step it stopped at).

``python -m runners.conformance --spec SPEC [--opt k=v ...] --store FILE --rank R --world-size W --out DIR``

What it records (the controller, testbed/conformance.py, turns it into one line per check):
  - the number of DDP buckets and steps run; a sha256 of every parameter after the last step (replicas must agree);
  - per step: payload bytes the compressor reported and bytes handed to torch.distributed collectives (all threads,
    counted by wrappers installed before any compressor module is imported);
  - for a compressor that claims LOSSLESS: the largest error of its averaged gradients against sync SGD's (a plain
    all-reduce of the same local gradients), relative to the largest reference entry, per step;
  - with state_dict/load_state_dict: the hash after resuming the last steps from a snapshot (fresh DDP, fresh state
    from the factory, load_state_dict) next to the hash of the run that went on;
  - collectives still pending after the last step (issued asynchronously and never completed);
  - the wall time of each step.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import sys
import time
from datetime import timedelta

LAYERS = 22  # DDP packs each weight with its bias: one bucket per layer with a tiny cap
WIDTH = 32
BATCH = 16
CAP_MB = 0.0001
JITTER_S = 0.002
RESUMED_STEPS = 2


def _stage(out: str, rank: int, text: str) -> None:
    with open(os.path.join(out, f"rank{rank}.stage"), "w") as f:
        f.write(text + "\n")


def _hash_params(module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    from runners.contract import ConformanceArgs, ContractError

    try:
        args = ConformanceArgs.from_argv(sys.argv[1:] if argv is None else list(argv))
    except ContractError as e:
        print(f"conformance: error: {e}", file=sys.stderr)
        return 2
    rank, out = args.rank, args.out
    _stage(out, rank, "starting")

    from runners import plugins

    counter = plugins.install_counters()  # before runners.compressors binds its all-gather at import
    rng = random.Random(args.seed * 7919 + rank)
    jitter = [False]

    def before_collective() -> None:
        if jitter[0]:
            time.sleep(rng.uniform(0.0, JITTER_S))

    counter.before = before_collective

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors

    torch.set_num_threads(1)
    options = args.option_dict()
    if args.spec == "syncsgd" and "builtin" not in options:
        options["builtin"] = False  # check the Python hook (builtin: DDP's C++ all-reduce, no hook to check)
    try:
        state, hook = compressors.get(args.spec, **options)
    except ValueError as e:
        print(f"conformance: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2

    def factory_state():
        return compressors.get(args.spec, **options)

    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank, world_size=args.world_size,
                            timeout=timedelta(seconds=args.collective_timeout_s))  # fmt: skip
    record: dict = {"rank": rank, "steps": [], "buckets": 0}

    def build_module():
        torch.manual_seed(1234)
        layers = []
        for _ in range(LAYERS):
            layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
        module = nn.Sequential(*layers[:-1])
        for prm in module.parameters():  # per-rank random delays in backward, per gradient
            prm.register_hook(lambda g: (time.sleep(rng.uniform(0.0, JITTER_S)) if jitter[0] else None, g)[1])
        return module

    def batch(step: int):
        g = torch.Generator().manual_seed(10_000 * (rank + 1) + step)
        return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)

    buckets: set[int] = set()

    current = [state, hook]  # the compressor the DDP hook forwards to (swapped for the resumed state)

    def make_ddp(module):
        ddp = DDP(module, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=True)
        if getattr(state, "builtin", False):
            compressors.attach(ddp, state, hook)
        else:

            def forwarding(cur, bucket):
                buckets.add(bucket.index())
                return cur[1](cur[0], bucket)

            ddp.register_comm_hook(current, forwarding)
        return ddp

    lossless = bool(getattr(state, "LOSSLESS", False))
    tolerance = float(getattr(state, "TOLERANCE", None) or plugins.DEFAULT_TOLERANCE)
    warmup = int(getattr(state, "warmup_iters", 0) or 0)
    total = warmup + max(args.steps, RESUMED_STEPS + 1)
    snapshot_at = total - RESUMED_STEPS

    def step_once(ddp, opt, st, step: int, measure: bool) -> dict:
        x, y = batch(step)
        row: dict = {"step": step}
        ref = None
        if measure and lossless:
            with ddp.no_sync():
                nn.functional.mse_loss(ddp(x), y).backward()
            ref = [prm.grad.detach().clone() for prm in ddp.module.parameters()]
            for r in ref:  # sync SGD: the plain average, issued here in parameter order on every rank
                dist.all_reduce(r)
                r.div_(args.world_size)
            opt.zero_grad(set_to_none=False)
        stats = getattr(st, "stats", None)
        if stats is not None:
            stats.reset()
        counter.reset_totals()
        counter.all_threads = True
        jitter[0] = True
        t0 = time.perf_counter()
        nn.functional.mse_loss(ddp(x), y).backward()
        row["backward_s"] = time.perf_counter() - t0
        jitter[0] = False
        counter.all_threads = False
        row["counted_bytes"] = counter.total_bytes
        row["collectives"] = counter.total_calls
        if getattr(st, "builtin", False):
            row["reported_bytes"] = None
        elif stats is not None:
            row["reported_bytes"] = int(stats.payload_bytes)
        if ref is not None:
            # relative to the largest reference entry of the step (16-bit formats flush tiny entries to zero)
            scale = max(float(r.abs().max()) for r in ref) or 1.0
            worst = max(float((prm.grad - r).abs().max()) for prm, r in zip(ddp.module.parameters(), ref, strict=True))
            row["lossless_error"] = worst / scale
        opt.step()
        opt.zero_grad(set_to_none=False)
        row["step_s"] = time.perf_counter() - t0
        return row

    try:
        module = build_module()
        ddp = make_ddp(module)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        snapshot = None
        resumable = callable(getattr(state, "state_dict", None)) and callable(getattr(state, "load_state_dict", None))
        for step in range(total):
            if step == snapshot_at and resumable:
                snapshot = (copy.deepcopy(module.state_dict()), copy.deepcopy(opt.state_dict()),
                            copy.deepcopy(state.state_dict()))  # fmt: skip
            _stage(out, rank, f"step {step + 1} of {total}")
            record["steps"].append(step_once(ddp, opt, state, step, measure=step >= warmup))
        record["buckets"] = len(buckets)
        record["total_steps"] = total
        record["warmup_steps"] = warmup
        record["hash"] = _hash_params(module)
        record["lossless"] = lossless
        record["tolerance"] = tolerance
        _stage(out, rank, "pending check")
        counter.all_threads = False
        deadline = time.monotonic() + 5.0
        pending = [w for w in counter.pending if not w.is_completed()]
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)  # bounded: a running collective completes in this time, one no peer issued does not
            pending = [w for w in pending if not w.is_completed()]
        record["pending"] = len(pending)
        if callable(getattr(state, "close", None)):
            state.close()
        if snapshot is not None:
            # the same DDP job (its bucket layout is the rebuilt one), parameters and optimizer put back, and a
            # fresh state from the factory that only load_state_dict() informs
            _stage(out, rank, "resuming from state_dict")
            state2, _hook2 = factory_state()
            state2.load_state_dict(snapshot[2])
            current[0] = state2
            with torch.no_grad():
                module.load_state_dict(snapshot[0])
            opt.load_state_dict(snapshot[1])
            for step in range(snapshot_at, total):
                _stage(out, rank, f"resumed step {step + 1} of {total}")
                step_once(ddp, opt, state2, step, measure=False)
            record["resumed_hash"] = _hash_params(module)
            if callable(getattr(state2, "close", None)):
                state2.close()
        _stage(out, rank, "leaving")
        dist.barrier()
    finally:
        with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
            json.dump(record, f)
        os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
