"""`testbed check-compressor --convergence`: does the compressor learn, not only iterate? (issue 33)

Trains the small CNN on the real Fashion-MNIST (runners.train with --data fashion-mnist) on this machine, gloo over
loopback, twice from the same seed: with sync SGD and with the compressor, each for a bounded budget with the stop at
a target test accuracy. One line compares the steps to target: a plugin author sees at once that a compressor that
iterates fast learns slowly. Verdict: pass when it reaches the target within the budget and within SLOWER_OK x sync
SGD's steps; fail when it never reaches the target or needs more than that.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runners import catalog, datafiles
from runners.contract import RankArgs, torchrun_env
from testbed import ranks
from testbed.conformance import Check, rank_env
from testbed.errors import InputError

TARGET, MAX_STEPS, EVAL_EVERY, LR, BATCH = 0.5, 400, 50, 0.05, 32  # sync SGD: 0.5 near step 150 (2 ranks, seed 0)
SLOWER_OK = 1.5  # a compressor may need up to this many times sync SGD's steps and pass
POLL_S = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(spec: str, options: dict[str, Any], plugin_path: str | None, *, world_size: int, target: float,
          max_steps: int, timeout_s: float, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """One run of `world_size` ranks to the target; rank 0's summary (steps_to_target, curve, ...)."""
    with tempfile.TemporaryDirectory(prefix="gc-convergence-") as tmp:
        out = Path(tmp)
        args = RankArgs(model="cnn", out=str(out), compressor=spec, options=tuple(sorted(options.items())),
                        batch_size=BATCH, warmup_iters=2, seed=seed, lr=LR, backend="gloo", iface="lo",
                        timeout_s=max(30.0, timeout_s / 4), threads=1, data="fashion-mnist", eval_every=EVAL_EVERY,
                        target_accuracy=target, max_steps=max_steps)  # fmt: skip
        port = _free_port()
        starts = []
        for rank in range(world_size):
            env = {**rank_env(plugin_path), **torchrun_env(rank=rank, world_size=world_size, local_rank=0,
                                                         local_world_size=1, group_rank=rank,
                                                         master_addr="127.0.0.1", master_port=port)}  # fmt: skip
            starts.append(ranks.Rank(ranks.THIS_MACHINE.host, [sys.executable, "-P", "-m", "runners.train",
                                                               *args.to_argv()], env, out / f"rank{rank}.log", out))  # fmt: skip
        with ranks.running(ranks.THIS_MACHINE, starts) as procs:
            # until every rank ended, one failed (fail fast) or the deadline
            ranks.watch(procs, deadline=time.monotonic() + timeout_s, poll_s=POLL_S)
        codes = [p.poll() for p in procs]
        if any(c == 2 for c in codes):
            r = codes.index(2)
            lines = (out / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
            raise InputError((lines[-1] if lines else "bad input").removeprefix("train: error: "))
        summary = out / "summary.json"
        if any(c != 0 for c in codes) or not summary.is_file():
            r = next((i for i, c in enumerate(codes) if c != 0), 0)
            lines = (out / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
            return {"error": f"rank {r} exit {codes[r]}: {lines[-1] if lines else 'no output'}"}
        return json.loads(summary.read_text())


def check_args(target: float, max_steps: int) -> None:
    """--target-accuracy and --max-steps of the convergence check, and the data set here: InputError (exit 2)."""
    if not 0 < target <= 1:
        raise InputError(f"--target-accuracy {target}: expected a fraction in (0, 1]")
    if not (isinstance(max_steps, int) and EVAL_EVERY <= max_steps <= 100_000):
        raise InputError(f"--max-steps {max_steps}: expected an integer in [{EVAL_EVERY}, 100000]")
    entry, root = catalog.parse_data("fashion-mnist")
    try:
        datafiles.check(entry.kind, root)
    except datafiles.DataMissing as e:
        raise InputError(f"--convergence needs Fashion-MNIST: {e}") from None


def check_convergence(spec: str, options: dict[str, Any], plugin_path: str | None, *, world_size: int = 2,
                      target: float = TARGET, max_steps: int = MAX_STEPS, timeout_s: float = 600.0) -> Check:  # fmt: skip
    """The `convergence` line: steps to `target` with the compressor against sync SGD's (same seed and data)."""
    check_args(target, max_steps)
    base = train("syncsgd", {}, None, world_size=world_size, target=target, max_steps=max_steps, timeout_s=timeout_s)
    mine = base if spec == "syncsgd" and not options else train(
        spec, options, plugin_path, world_size=world_size, target=target, max_steps=max_steps, timeout_s=timeout_s)
    for who, s in (("syncsgd", base), (spec, mine)):
        if "error" in s:
            return Check("convergence", "fail", f"{who} did not finish: {s['error']}")
    b, m = base["steps_to_target"], mine["steps_to_target"]
    acc = f"final test accuracy {mine['final_test_accuracy']:.3f} (syncsgd {base['final_test_accuracy']:.3f})"
    what = f"cnn on Fashion-MNIST, {world_size} ranks, target {target:g}, at most {max_steps} steps"
    if m is None:
        return Check("convergence", "fail", f"{spec} never reached {target:g} in {max_steps} steps; syncsgd in "
                     f"{b if b is not None else 'never'}; {acc} ({what})")  # fmt: skip
    if b is None:
        return Check("convergence", "pass", f"{spec} reached {target:g} in {m} steps, syncsgd never did; {acc} ({what})")
    ratio = m / b
    status = "pass" if ratio <= SLOWER_OK else "fail"
    return Check("convergence", status, f"{spec} reached {target:g} in {m} steps, syncsgd in {b} ({ratio:.2f}x its "
                 f"steps{'' if status == 'pass' else f'; more than {SLOWER_OK:g}x'}); {acc} ({what})")  # fmt: skip
