"""Run a function on N real gloo ranks (spawned processes, 127.0.0.1) and collect their results.

No mocks: each rank is a process with its own gloo process group (FileStore rendezvous in a temp dir, so no port
races; gloo's own connections go over loopback). A failing rank cannot hang the test: the process group has a
collective timeout, and the harness kills (by PID) every rank still alive at the deadline. The deadline counts from
the moment every rank has joined the process group: starting a rank (importing torch) takes seconds on a quiet machine
and many more on a loaded one, and must not eat the time given to the work (a control that must fail in the work
would pass on a timeout before it began).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from datetime import timedelta

import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT_S = 30
START_TIMEOUT_S = 180.0  # to start every rank and join the group: ~5 s on a quiet 2-core machine
POLL_S = 0.05


def _entry(fn, rank, world, store_path, out_dir, args, collective_timeout_s=COLLECTIVE_TIMEOUT_S, env=None):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ.update(env or {})
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store_path}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=collective_timeout_s),
        )
        open(os.path.join(out_dir, f"rank{rank}.ready"), "w").close()
        try:
            result = fn(rank, world, *args)
            dist.barrier()  # leave together: a rank tearing its pairs down while a peer still talks can abort
        finally:
            dist.destroy_process_group()
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    # As runners/train.py does: skip C++ static destructors at exit. A compressor's worker thread or gloo's store
    # client can abort the process there ("terminate called without an active exception", exit -6) after every
    # result was written (seen with 3 ranks in `make test`).
    os._exit(0)


def run_world(
    fn,
    world: int,
    *args,
    timeout_s: float = 120.0,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
    env: dict | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> list:
    """``fn(rank, world, *args)`` on ``world`` ranks; returns the per-rank results (picklable) in rank order.
    ``env`` is set in each rank before torch is imported (e.g. TORCH_DISTRIBUTED_DEBUG). ``timeout_s`` counts from the
    moment every rank joined the group (at most ``start_timeout_s`` after the start), or one ended before that."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gcdist-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(fn, r, world, store, tmp, args, collective_timeout_s, env))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        started = time.monotonic() + start_timeout_s
        ready = [os.path.join(tmp, f"rank{r}.ready") for r in range(world)]
        while (time.monotonic() < started and not all(map(os.path.exists, ready))
               and all(p.is_alive() for p in procs)):  # fmt: skip
            time.sleep(POLL_S)  # polling a condition under a deadline
        deadline = time.monotonic() + timeout_s
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            hung = [p for p in procs if p.is_alive()]
            for p in hung:
                p.kill()  # by PID: only the ranks this harness started
            for p in hung:
                p.join(10)
        errors = []
        for r in range(world):
            err = os.path.join(tmp, f"rank{r}.err")
            if os.path.exists(err):
                with open(err) as f:
                    errors.append(f"rank {r}:\n{f.read()}")
        if errors:
            raise AssertionError("\n".join(errors))
        if hung:
            joined = sum(map(os.path.exists, ready))
            raise TimeoutError(f"ranks {[procs.index(p) for p in hung]} still running {timeout_s}s after {joined} of "
                               f"{world} ranks joined the group")  # fmt: skip
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise AssertionError(f"ranks exited non-zero: {bad}")
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
