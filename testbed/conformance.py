"""`testbed check-compressor SPEC`: does a compressor hook behave on real gloo ranks, many buckets and uneven ranks?

Starts `world_size` processes of ``python -m runners.conformance`` on this machine (gloo over loopback, a FileStore
rendezvous in a temporary directory, an allowlisted environment with the plugin path and the code root as PYTHONPATH,
`python -P` in a fixed working directory: nothing of the user's current directory is imported), each a small
DDP job of 22 buckets with per-rank random delays in backward and before every collective, waits for them under a
deadline, kills them (by process group) when it passes, and judges what they wrote:

  order       every rank finished every step (a hang or a crash is a failure, with the reason and the step)
  replicas    the parameters of every rank are bitwise identical after the last step
  lossless    (LOSSLESS compressors) averaged gradients within TOLERANCE of sync SGD's, relative to the largest entry
  payload     bytes the compressor reported per step == bytes handed to the collectives (all threads)
  state_dict  resuming the last steps from state_dict() in a fresh DDP job gives the same parameters, bitwise
  pending     no collective left pending after the last step
  time        wall time per step (delays included), reported
A check that does not apply (no state_dict, not lossless, DDP's built-in all-reduce) is skipped and says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runners import catalog
from runners.contract import ConformanceArgs
from testbed import ranks
from testbed.errors import InputError

POLL_S = 0.05
ORDER_SIGNS = ("Timed out", "Application timeout", "EnforceNotMet", "preamble", "Connection closed by peer", "mismatch",
               "unbound_buffer")
DEFAULT_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | fail | skip
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():4}  {self.name:10}  {self.detail}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    spec: str
    checks: tuple[Check, ...]
    plugin: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "ok": self.ok, "plugin": self.plugin,
                "checks": [dataclasses.asdict(c) for c in self.checks]}  # fmt: skip


def validate(spec: str, options: dict[str, Any], plugin_path: str | None) -> dict[str, Any] | None:
    """InputError (exit 2, nothing started) for a bad spec or options; the plugin's description for a plugin."""
    if catalog.is_plugin_spec(spec):
        from testbed import plugins

        return plugins.inspect(spec, options, plugin_path)
    from testbed.config import check_compressor

    if plugin_path is not None:
        raise InputError(f"--plugin-path applies to MODULE:FACTORY compressors, not to the built-in {spec!r}")
    check_compressor(spec, options)
    return None


def rank_env(plugin_path: str | None) -> dict[str, str]:
    from testbed.launch_plan import forwarded_env

    env = forwarded_env(os.environ)
    env.update(PATH=os.environ.get("PATH", os.defpath), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # fmt: skip
    from testbed.plugins import plugin_pythonpath

    env["PYTHONPATH"] = plugin_pythonpath(plugin_path)
    return env


def _tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "(no output)"
    for needle in ("EnforceNotMet", "Error", "error", "Exception"):
        hits = [ln for ln in lines if needle in ln and not ln.startswith("File ")]
        if hits:
            return hits[-1][:300]
    return (lines[-1] if lines else "(no output)")[:300]


def _stage(out: Path, rank: int) -> str:
    try:
        return (out / f"rank{rank}.stage").read_text().strip()
    except FileNotFoundError:
        return "not started"


def crash_reason(out: Path, rank: int, code: int) -> str:
    """Why a rank that exited with `code` failed, from its log in `out`: a crash with the log's last error line, named
    a collective-order failure when the whole log (the tail may cut it off) shows one of gloo's signs of ranks that
    issued collectives in different orders (ORDER_SIGNS)."""
    log = _tail(out / f"rank{rank}.log")
    reason = f"crash: rank {rank} exited with code {code} at {_stage(out, rank)!r}: {log}"
    path = out / f"rank{rank}.log"
    full = path.read_text(errors="replace") if path.exists() else log
    if any(k in full for k in ORDER_SIGNS):
        reason = ("collective order: ranks issued collectives in different orders (a collective issued from a future "
                  f"callback or another thread?); {reason}")  # fmt: skip
    return reason


def run_ranks(spec: str, options: dict[str, Any], plugin_path: str | None, *, world_size: int, steps: int,
              timeout_s: float, seed: int = 0) -> tuple[list[dict | None], str | None]:  # fmt: skip
    """Start the ranks, wait; (per-rank records or None, failure reason or None)."""
    with tempfile.TemporaryDirectory(prefix="gc-conformance-") as tmp:
        out = Path(tmp)
        collective_timeout = max(5.0, min(20.0, timeout_s / 3))
        env = rank_env(plugin_path)
        starts = []
        for rank in range(world_size):
            args = ConformanceArgs(spec=spec, store=str(out / "store"), rank=rank, world_size=world_size, out=str(out),
                                   options=tuple(options.items()), steps=steps,
                                   collective_timeout_s=collective_timeout, seed=seed)  # fmt: skip
            starts.append(ranks.Rank(ranks.THIS_MACHINE.host, [sys.executable, "-P", "-m", "runners.conformance",
                                                               *args.to_argv()], env, out / f"rank{rank}.log", out))  # fmt: skip
        reason = None
        with ranks.running(ranks.THIS_MACHINE, starts) as procs:
            watched = ranks.watch(procs, deadline=time.monotonic() + timeout_s, poll_s=POLL_S)
            if watched.failed is not None:
                bad = [(r, c) for r, c in enumerate(watched.codes) if c not in (None, 0)]
                if any(c == 2 for _, c in bad):
                    r = next(r for r, c in bad if c == 2)
                    raise InputError(_tail(out / f"rank{r}.log").removeprefix("conformance: error: "))
                # the first rank to fail names the reason; give the others a moment to fail too (their logs)
                ranks.settle(procs, 2.0, POLL_S)
                reason = crash_reason(out, watched.failed, watched.codes[watched.failed])
            elif watched.timed_out:
                waiting = watched.running
                stages = ", ".join(f"rank {r} at {_stage(out, r)!r}" for r in waiting)
                reason = (f"hang: ranks {waiting} still running after {timeout_s:g} s ({stages}); collectives "
                          "were issued in different orders on different ranks, or a rank waits for one its "
                          "peers never issue")  # fmt: skip
        records: list[dict | None] = []
        for rank in range(world_size):
            try:
                records.append(json.loads((out / f"rank{rank}.json").read_text()))
            except (FileNotFoundError, ValueError):
                records.append(None)
        return records, reason


def judge(records: list[dict | None], reason: str | None, world_size: int) -> tuple[Check, ...]:
    """One Check per property, from the ranks' records (see the module docstring)."""
    if reason is not None or any(r is None or "hash" not in r for r in records):
        why = reason or "a rank wrote no complete record"
        checks = [Check("order", "fail", why)]
        for name in ("replicas", "lossless", "payload", "state_dict", "pending"):
            checks.append(Check(name, "skip", "not judged: the ranks did not finish"))
        return tuple(checks)
    r0 = records[0]
    checks = [Check("order", "pass", f"{world_size} ranks finished {r0['total_steps']} steps with {r0['buckets']} DDP "
                    "buckets under per-rank random delays in backward and before each collective")]  # fmt: skip
    if r0["buckets"] < 20:
        checks[0] = Check("order", "fail", f"only {r0['buckets']} buckets were exercised; expected >= 20")
    hashes = {r["hash"] for r in records}
    checks.append(Check("replicas", "pass", f"parameters bitwise identical on {world_size} ranks")
                  if len(hashes) == 1 else
                  Check("replicas", "fail", f"parameters differ between ranks after {r0['total_steps']} steps "
                        f"({len(hashes)} distinct hashes)"))  # fmt: skip
    if r0.get("lossless"):
        errs = [s["lossless_error"] for r in records for s in r["steps"] if "lossless_error" in s]
        worst = max(errs) if errs else float("nan")
        tol = r0["tolerance"]
        checks.append(Check("lossless", "pass" if worst <= tol else "fail",
                            f"largest error vs sync SGD {worst:.2e} of the largest entry (tolerance {tol:g})"))  # fmt: skip
    else:
        checks.append(Check("lossless", "skip", "not claimed (LOSSLESS not set): no comparison with sync SGD"))
    steps = [s for r in records for s in r["steps"]]
    if any(s.get("reported_bytes", 0) is None for s in steps):
        checks.append(Check("payload", "skip", "DDP's built-in all-reduce: no hook, payload = gradient bytes"))
    elif not any("reported_bytes" in s for s in steps):
        checks.append(Check("payload", "skip", "the state reports no payload (no stats)"))
    else:
        off = [s for s in steps if s["reported_bytes"] != s["counted_bytes"]]
        per_step = statistics.fmean(s["counted_bytes"] for s in steps)
        if off:
            s = off[0]
            checks.append(Check("payload", "fail", f"step {s['step']}: reported {s['reported_bytes']} B, the "
                                f"collectives carried {s['counted_bytes']} B ({s['collectives']} collectives); "
                                f"{len(off)} of {len(steps)} rank-steps differ"))  # fmt: skip
        else:
            checks.append(Check("payload", "pass", f"reported bytes == bytes handed to collectives on every step "
                                f"({per_step:.0f} B per rank-step on average)"))  # fmt: skip
    if "resumed_hash" in r0:
        same = all(r["resumed_hash"] == r["hash"] for r in records)
        checks.append(Check("state_dict", "pass" if same else "fail",
                            "resuming from state_dict() gives bitwise the same parameters" if same else
                            "resuming from state_dict() gives other parameters than going on"))  # fmt: skip
    else:
        checks.append(Check("state_dict", "skip", "the state has no state_dict()/load_state_dict()"))
    pending = sum(r["pending"] for r in records)
    checks.append(Check("pending", "pass" if pending == 0 else "fail",
                        "no collective left pending after the last step" if pending == 0 else
                        f"{pending} collective(s) still pending after the last step"))  # fmt: skip
    times = [s["step_s"] for s in steps if "lossless_error" not in s] or [s["step_s"] for s in steps]
    checks.append(Check("time", "pass", f"{statistics.median(times) * 1e3:.1f} ms per step (median, 22-layer MLP, "
                        f"delays up to 2 ms per gradient and collective included)"))  # fmt: skip
    return tuple(checks)


def check_compressor(spec: str, options: dict[str, Any] | None = None, *, plugin_path: str | None = None,
                     world_size: int = 2, steps: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S,
                     seed: int = 0) -> Outcome:  # fmt: skip
    """Validate, run the ranks, judge. InputError (exit 2) for bad input, before anything starts."""
    options = dict(options or {})
    if not (isinstance(world_size, int) and 2 <= world_size <= 8):
        raise InputError(f"--world-size {world_size}: expected an integer in [2, 8]")
    if not (isinstance(steps, int) and 3 <= steps <= 100):
        raise InputError(f"--steps {steps}: expected an integer in [3, 100]")
    if not (timeout_s == timeout_s and 5 <= timeout_s <= 3600):
        raise InputError(f"--timeout {timeout_s:g}: expected seconds in [5, 3600]")
    info = validate(spec, options, plugin_path)
    records, reason = run_ranks(spec, options, plugin_path, world_size=world_size, steps=steps, timeout_s=timeout_s,
                                seed=seed)  # fmt: skip
    return Outcome(spec, judge(records, reason, world_size), info)
