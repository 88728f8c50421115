"""GPU check: sync SGD vs PowerSGD over NCCL sockets between 2 emulated hosts on this machine's GPU(s).

    make gpu-check GPU_CHECK_ARGS="--out /tmp/gpu"   # = python3 bench/gpu_check.py (from the repository root)
    python3 bench/gpu_check.py --rates 1gbit,10gbit --model resnet50 --image-size 224 --deadline 540 --out DIR

Made for a first contact with a GPU machine that may be lent for a few minutes, once: it gives the tables or a
precise diagnosis, and it ends by --deadline (default 540 s) whatever happens. Stages, each bounded by what is left
of the deadline (a stage that no longer fits is skipped, said so, and the next one runs):
  1. facts: torch, CUDA, NCCL, driver (asked in a subprocess: the controller holds no CUDA context);
  2. capabilities, one line each: network namespace, veth (a TCP connection across the bridge), HTB (read back),
     the `ip` binary (not needed: namespaces are entered from Python), iperf3, and NCCL sockets (the preflight);
  3. preflight through the product's launch path (`make_plan` + `cluster.start` with the planned environment, watched
     by `watch_ranks`, 90 s): two ranks, one 1 MB all-reduce (NCCL sockets on GPU; gloo on CPU). On failure both
     ranks' log tails are printed (NCCL_DEBUG=WARN is set unless given), then it is retried once over loopback with the
     reason; if that fails too, every stage that needs a collective is skipped;
  4. per rate: the NCCL all-reduce bus bandwidth, then a trial per compressor (`testbed.launch.run_trial`: tc shaping,
     iperf3 probe, the launch plan, NCCL over sockets on the shaped veth), about 120 s each, every table row printed
     as it finishes; with --timeline N, each trial keeps its last N iterations' marks and a table shows the median
     one per rank split into lanes (forward + backward, codec, codec on the critical path, wire, exposed);
  5. the performance model on the same cluster (`--no-model` leaves it out): `testbed calibrate` at each rate, a
     profile of the model on this machine's device (in lockstep when emulated hosts share a GPU, in a child process
     ended at the deadline), the report's predicted against measured iteration time per trial.
Everything goes under --out: the Markdown tables (gpu-check.md, written line by line, so a cut-off run keeps what it
printed) and one tarball (gpu-check.tar.gz: results rows, every rank log, the preflight logs, calibrations, profile,
report, and gpu-check.log with every log tail printed).

Made for a bare GPU machine: its python3 brings torch (and pandas, pyarrow, psutil, rich); pure-Python wheels the
controller needs that are missing there (pyroute2) travel in .gpu-wheels/ (`make gpu-wheels`) and are put on sys.path
here; pyroute2 is imported only when namespaces are tried, so the loopback fallback runs without it. Without CUDA it
prints "no CUDA device: skipped" and exits 0. Needs root for namespaces. Exit 0: everything ran and passed; 1:
something failed or was skipped; 2: bad flags (nothing started).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import json
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), *sorted(glob.glob(str(REPO / ".gpu-wheels" / "*.whl")))]

from runners.contract import DEFAULT_PROBE_S  # noqa: E402
from testbed.ranks import ThisMachine  # noqa: E402  (after the path: no pyroute2, no torch)

NAME = "gpuchk"
LOOPBACK_STARTER = ThisMachine(grace_s=3.0)  # the loopback fallback's ranks: SIGTERM, 3 s, then SIGKILL
RESERVE_S = 20.0  # kept back from every stage: removing the cluster and writing the tarball
PREFLIGHT_S = 90.0
TRIAL_S = 120.0
CALIBRATION_S = 180.0
TAIL_LINES = 15
TRIAL_OVERHEAD_S = 10.0  # a trial's shaping, iperf3 probe, rank kill and shaping restore, beside its ranks' timeout


# ------------------------------------------------------------------------------------------------ time and output
class Deadline:
    """The whole check's deadline; each stage asks for its time and gets what is left (or None: skip it)."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.end = self.started + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def budget(self, want_s: float, minimum_s: float, overhead_s: float = 0.0) -> float | None:
        """min(want_s, what is left before the reserve and the stage's own overhead), or None when that is under
        minimum_s."""
        have = min(want_s, self.left() - RESERVE_S - overhead_s)
        return have if have >= minimum_s else None

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Output:
    """Tables go to stdout and to gpu-check.md (line by line); progress and log tails to stderr and gpu-check.log."""

    def __init__(self, out: Path, work: Path) -> None:
        self.md_path = out / "gpu-check.md"
        self.md = open(self.md_path, "w", buffering=1)  # noqa: SIM115 - closed in close()
        self.log = open(work / "gpu-check.log", "w", buffering=1)  # noqa: SIM115
        self._later: list[tuple[str, list[Path]]] = []

    def table(self, text: str = "") -> None:
        print(text, flush=True)
        self.md.write(text + "\n")
        self.log.write(text + "\n")

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        self.log.write(text + "\n")

    def tails(self, what: str, logs: list[Path], later: bool = False) -> None:
        """Both (every) ranks' last lines: printed (stdout, so they come back with the run) and kept in the log.
        `later`: held back until `flush_tails` (not in the middle of a table)."""
        if later:
            self._later.append((what, logs))
            return
        for path in logs:
            try:
                lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            except FileNotFoundError:
                lines = ["(no log)"]
            self.table(f"\n<details><summary>{what}: {path.name} (last {TAIL_LINES} lines)</summary>\n")
            self.table("```")
            for line in lines or ["(empty log)"]:
                self.table(line.rstrip())
            self.table("```\n</details>")

    def flush_tails(self) -> None:
        held, self._later = self._later, []
        for what, logs in held:
            self.tails(what, logs)

    def close(self) -> None:
        self.flush_tails()
        self.md.close()
        self.log.close()


# ------------------------------------------------------------------------------------------------ facts
FACTS_SOURCE = """
import json, torch
if not torch.cuda.is_available():
    print(json.dumps(None)); raise SystemExit
f = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
     "gpu_name": torch.cuda.get_device_name(0)}
try:
    f["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:
    f["nccl"] = f"unknown ({e})"
print(json.dumps(f))
"""


def cuda_facts() -> dict | None:
    """torch, CUDA, GPUs, NCCL and driver, asked in a subprocess (the controller never holds a CUDA context: it
    would take memory on the GPU the ranks use, and a child forked later could not use CUDA)."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", FACTS_SOURCE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "asking torch for CUDA facts took more than 120 s"}
    if done.returncode != 0:
        return {"error": f"torch not usable: {(done.stderr.strip().splitlines() or ['?'])[-1]}"}
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    if facts is None:
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout.split()  # fmt: skip
            facts["driver"] = out[0] if out else None
    return facts


# ------------------------------------------------------------------------------------------------ capabilities
LISTEN_SOURCE = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
s.settimeout(30)
c, _ = s.accept()
c.sendall(b"veth-ok")
c.close()
"""
CONNECT_SOURCE = """
import socket, sys, time
end = time.monotonic() + 20
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.1)
print(c.recv(16).decode())
"""


def capabilities(name: str, work: Path, say) -> dict[str, tuple[bool, str]]:
    """namespace, veth, HTB, ip, iperf3: (works, how we know), each found by doing it. NCCL sockets: the preflight."""
    caps: dict[str, tuple[bool, str]] = {}
    ip = shutil.which("ip")
    caps["ip"] = (ip is not None, f"{ip} (not needed: namespaces are entered from Python)" if ip else
                  "absent (not needed: namespaces are entered from Python with setns)")  # fmt: skip
    iperf = shutil.which("iperf3")
    caps["iperf3"] = (iperf is not None, iperf or "absent: rates are checked with the NCCL bus bandwidth only")
    not_tried = "not tried: no namespaces"
    try:
        import pyroute2  # noqa: F401  (lazily: the loopback fallback runs without it)
    except ImportError as e:
        caps["namespace"] = (False, f"pyroute2 not importable ({e}); `make gpu-wheels` and carry .gpu-wheels")
        caps["veth"] = caps["HTB"] = (False, not_tried)
        return caps
    if os.geteuid() != 0:
        caps["namespace"] = (False, "needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
        caps["veth"] = caps["HTB"] = (False, not_tried)
        return caps
    from shaping.plan import LinkShape
    from testbed.cluster.local import LocalCluster

    probe = name + "p"
    try:
        cluster, _ = LocalCluster.up(probe, 2)
    except Exception as e:  # noqa: BLE001 - the finding is the point
        caps["namespace"] = (False, f"making 2 namespaces joined by veth and a bridge failed: {type(e).__name__}: {e}")
        caps["veth"] = caps["HTB"] = (False, not_tried)
        with contextlib.suppress(Exception):
            LocalCluster.remove(probe)
        return caps
    try:
        h0, h1 = cluster.hosts()
        done = cluster.run(h0, [sys.executable, "-I", "-c", "import os; print(os.stat('/proc/self/ns/net').st_ino)"],
                           timeout_s=30)  # fmt: skip
        want = os.stat(f"/run/netns/{h0.netns}").st_ino
        inside = done.returncode == 0 and done.stdout.strip() == str(want)
        caps["namespace"] = (inside, "made with pyroute2, entered with setns" if inside else
                             f"a process did not land in {h0.netns}: {(done.stderr or done.stdout).strip()[-300:]}")
        port = "29411"
        server = cluster.start(h1, [sys.executable, "-I", "-c", LISTEN_SOURCE, h1.address, port], env={},
                               log_path=work / "capabilities" / "veth-listen.log")  # fmt: skip
        try:
            done = cluster.run(h0, [sys.executable, "-I", "-c", CONNECT_SOURCE, h1.address, port], timeout_s=40)
        finally:
            server.kill_group()
        veth = done.returncode == 0 and "veth-ok" in done.stdout
        caps["veth"] = (veth, f"TCP {h0.name} -> {h1.name} ({h1.address}) across the bridge" if veth else
                        f"TCP {h0.name} -> {h1.name} failed: {(done.stderr or done.stdout).strip()[-300:]}")  # fmt: skip
        try:
            cluster.apply_shaping(LinkShape(1_000_000_000))
            rate = cluster.status()["hosts"][0]["links"]["upload"].get("rate_bps")
            caps["HTB"] = (rate == 1_000_000_000, "1gbit applied and read back" if rate == 1_000_000_000 else
                           f"HTB read back {rate}, not 1gbit")  # fmt: skip
        except Exception as e:  # noqa: BLE001
            caps["HTB"] = (False, f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        caps.setdefault("namespace", (False, f"{type(e).__name__}: {e}"))
        caps.setdefault("veth", (False, f"{type(e).__name__}: {e}"))
        caps.setdefault("HTB", (False, "not tried"))
    finally:
        try:
            LocalCluster.remove(probe)
        except Exception as e:  # noqa: BLE001 - said, and the check goes on
            say(f"  removing the capability probe's namespaces failed: {e}")
    return caps


# ------------------------------------------------------------------------------------------------ loopback
class LoopbackCluster:
    """Fallback when namespaces are not available: 2 'hosts' on 127.0.0.1, NCCL over loopback sockets, unshaped.
    Each host keeps its own NCCL host id (the plan sets one per emulated host). Imports nothing of pyroute2."""

    backend = "local"

    def __init__(self, name: str, gpus_per_host: list[list[int]]):
        from testbed.cluster.base import Host

        self.name = name
        self._hosts = [Host(f"h{i}", "127.0.0.1", "lo", None, gpus=tuple(g), emulated=True)
                       for i, g in enumerate(gpus_per_host)]  # fmt: skip

    def hosts(self):
        return list(self._hosts)

    def threads_per_rank(self, world_size: int) -> int:
        from testbed.cluster.base import shared_cpu_threads

        return shared_cpu_threads(world_size)

    def rank_out_dir(self, local_dir, trial_id):
        return Path(local_dir).absolute()

    def recorded_shape(self):
        return None

    def apply_shaping(self, shape, hosts=None):
        raise RuntimeError("no shaping in the loopback fallback")

    def clear_shaping(self, hosts=None):
        return None

    def fetch(self, host, remote_dir, local_dir):
        return None

    def start(self, host, argv, *, env, log_path, workdir=None):
        """As the local cluster starts a rank (python -P, the code root first on PYTHONPATH, a working directory of
        its own), without a namespace."""
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", os.defpath), **env}
        argv = list(argv)
        if os.path.basename(argv[0]).startswith("python"):
            env["PYTHONPATH"] = ":".join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
            if argv[1:2] not in (["-P"], ["-I"]):
                argv.insert(1, "-P")
        return LOOPBACK_STARTER.start(host, argv, env=env, log_path=log_path, workdir=workdir)


# ------------------------------------------------------------------------------------------------ collectives
def allreduce_ranks(cluster, backend: str, work: Path, size_bytes: int, reps: int, timeout_s: float,
                    fail_rank: int | None = None) -> tuple[list, Path]:  # fmt: skip
    """Start bench/allreduce_rank.py on the 2 hosts through the product's launch path: the launch plan's placement
    and environment (torchrun variables, NCCL socket settings, host ids, the loader variables), `cluster.start`.
    Returns (processes, the folder whose logs/ has rank0.log and rank1.log)."""
    from testbed.config import Trial
    from testbed.launch import make_plan

    trial = Trial("syncsgd", None, 2, backend=backend, ranks_per_host=1, cluster=cluster.name)
    work.mkdir(parents=True, exist_ok=True)
    plan = make_plan(cluster, trial, work, timeout_s=timeout_s)
    from testbed import ranks

    starts = []
    for r in plan.ranks:
        argv = [sys.executable, str(REPO / "bench" / "allreduce_rank.py"), "--backend", backend, "--bytes",
                str(size_bytes), "--reps", str(reps), "--iface", r.host.data_iface, "--timeout-s",
                str(max(30, int(timeout_s)))]  # fmt: skip
        if fail_rank == r.rank:
            argv.append("--fail-at-init")
        starts.append(ranks.Rank(r.host, argv, r.env, work / "logs" / r.log_name))
    procs: list = []
    try:
        ranks.start(cluster, starts, into=procs)
    except BaseException:
        ranks.end(procs)
        raise
    return procs, work


def run_allreduce(cluster, backend: str, work: Path, size_bytes: int, reps: int, timeout_s: float, out: Output,
                  what: str, fail_rank: int | None = None, later: bool = False) -> tuple[dict | None, str]:  # fmt: skip
    """Run the 2 ranks to the end or the first failure (watch_ranks: a rank that exits non-zero ends it at once);
    returns (rank 0's JSON line, '') or (None, the reason), printing both ranks' log tails on failure."""
    from testbed import ranks
    from testbed.launch import TrialFailed, watch_ranks

    t0 = time.monotonic()
    try:
        procs, folder = allreduce_ranks(cluster, backend, work, size_bytes, reps, timeout_s, fail_rank)
    except Exception as e:  # noqa: BLE001 - a rank that cannot even start is the finding
        return None, f"starting the ranks failed: {type(e).__name__}: {e}"
    try:
        watch_ranks(procs, deadline=time.monotonic() + timeout_s, out_dir=folder)
    except TrialFailed as e:
        reason = f"{e} (after {time.monotonic() - t0:.1f} s)"
        out.say(f"  {what} failed: {reason}")
        out.tails(what, [folder / "logs" / "rank0.log", folder / "logs" / "rank1.log"], later)
        return None, reason
    finally:
        ranks.end(procs)
    lines = [x for x in (folder / "logs" / "rank0.log").read_text(errors="replace").splitlines() if x.startswith("{")]
    if not lines:
        out.tails(what, [folder / "logs" / "rank0.log", folder / "logs" / "rank1.log"], later)
        return None, "rank 0 printed no result"
    return json.loads(lines[-1]), f"{time.monotonic() - t0:.1f} s"


# ------------------------------------------------------------------------------------------------ model
def calibrate_at(cluster, rate: int | None, profiles: Path, backend: str, sizes: str, reps: int,
                 timeout_s: float, probe_s: float) -> str:  # fmt: skip
    """`testbed calibrate` at one trial rate (None: unshaped), the trials' backend and placement; one line."""
    from shaping.plan import LinkShape
    from shaping.units import rate_or_unshaped
    from testbed.calibrate import run_calibration
    from testbed.model_cli import parse_sizes
    from testbed.model_views import calibration_summary

    c, _ = run_calibration(cluster, profiles, shape=LinkShape(rate) if rate else None, unshaped=rate is None,
                           world_size=2, backend=backend, sizes_bytes=parse_sizes(sizes), reps=reps,
                           timeout_s=timeout_s, probe_s=probe_s)  # fmt: skip
    return f"- calibration at {rate_or_unshaped(rate)} ({c.backend}): {calibration_summary(c)}"


def model_check(args, results: Path, profiles: Path, device: str, ranks_per_device: int, threads: int) -> str:
    """Profile the model on this machine (as the trials' ranks share it), then the report's predicted against
    measured iteration time per trial and its crossover verdicts, with the calibrations stored in `profiles`."""
    from testbed import modelling
    from testbed.errors import TestbedError
    from testbed.report import report_from_dir

    measure = dict(image_size=args.image_size, iters=10, threads=threads, lockstep_timeout_s=180.0)
    compressors = args.compressors.split(",")
    note = ""
    try:
        prof, _ = modelling.measure_and_store(args.model, args.batch_size, compressors, device, profiles,
                                              colocated=ranks_per_device, **measure)  # fmt: skip
    except TestbedError as exc:
        if ranks_per_device == 1:
            raise
        note = f" (the lockstep profile of {ranks_per_device} ranks on one device failed: {exc}; solo instead)"
        prof, _ = modelling.measure_and_store(args.model, args.batch_size, compressors, device, profiles, **measure)
    res = report_from_dir(results, results / "report", profiles_dir=profiles, hook_blocks_backward=False)
    errors, crossovers = res.tables["errors"], res.tables["crossovers"]
    out = [f"profile: {prof.model}, batch {prof.batch_size}, {prof.device}, {prof.colocated_ranks} co-located "
           f"rank(s): forward + backward {(prof.forward_s + prof.backward_s) * 1e3:.1f} ms{note}\n"]  # fmt: skip
    codecs = [f"{n} {c.encode_s * 1e3:.1f} + {c.decode_s * 1e3:.1f}" for n, c in prof.compressors.items()
              if c.encode_s or c.decode_s]  # fmt: skip
    if codecs:  # beside the timelines' codec lane: what the prediction takes for each codec
        out.append(f"profile's codec, encode + decode ms over all buckets: {'; '.join(codecs)}\n")
    out.append("| rate | compressor | measured ms | predicted ms | error % |\n|---|---|---|---|---|")
    for _, e in errors.iterrows():
        out.append(f"| {e['bandwidth']} | {e['compressor']} | {e['measured_ms']:.1f} | {e['predicted_ms']:.1f} | "
                   f"{e['error_pct']:+.1f} |")  # fmt: skip
    out.append("\n| compressor | measured crossover | predicted | verdict |\n|---|---|---|---|")
    for _, c in crossovers.iterrows():
        out.append(f"| {c['compressor']} | {c['measured']} | {c['predicted']} | {c['verdict']} |")
    out += [f"- note: {n}" for n in res.notes]
    return "\n".join(out)


def _model_child(args, results: Path, profiles: Path, device: str, ranks_per_device: int, threads: int,
                 answer: Path) -> None:  # fmt: skip
    """The model stage in a process of its own session (spawned), so the deadline can end it and what it started:
    SIGTERM unwinds it (the co-located profile's finally ends its ranks' process groups), SIGKILL the rest."""
    os.setsid()

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        text = model_check(args, results, profiles, device, ranks_per_device, threads)
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        text = f"model check failed: {type(exc).__name__}: {exc}"
    answer.write_text(text)


def run_model_stage(args, results, profiles, device, ranks_per_device, threads, timeout_s: float) -> str:
    answer = results / "model-check.md"
    answer.unlink(missing_ok=True)
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_model_child, args=(args, results, profiles, device, ranks_per_device, threads,
                                                   answer), daemon=False)  # fmt: skip
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)  # unwinds: the lockstep ranks (own sessions) are ended by modelling
        child.join(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # what is left of its session
        child.join(10)
        return f"model check failed: skipped at the deadline after {timeout_s:.0f} s (profile or report unfinished)"
    return answer.read_text() if answer.is_file() else f"model check failed: the child exited {child.exitcode}"


# ------------------------------------------------------------------------------------------------ tables
TRIAL_HEADER = ("| rate | compressor | backend | status | ms/iter (p50) | samples/s | wire tx MB/iter/host | "
                "probe goodput | NCCL busbw | device |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip


def rate_label(rate: int | None, loopback: bool) -> str:
    from shaping.units import format_rate

    return format_rate(rate) if rate else ("unshaped (lo)" if loopback else "unshaped")


def trial_row(r: dict, busbw: float | None, label: str) -> str:
    from shaping.units import format_rate

    if r["status"] != "ok":
        return f"| {label} | {r['compressor']} | - | {r['status']}: {str(r['error'])[:160]} | - | - | - | - | - | - |"
    probe = r.get("measured_goodput_bps")
    return (f"| {label} | {r['compressor']} | {r.get('dist_backend')} | ok | {r['iter_time_s_p50'] * 1e3:.1f} | "
            f"{r['samples_per_s']:.1f} | {(r['wire_tx_bytes_per_iter'] or 0) / 1e6:.2f} | "
            f"{format_rate(probe) if probe else '-'} | {format_rate(busbw) if busbw else '-'} | "
            f"{r.get('device_name') or '-'} |")  # fmt: skip


TIMELINE_HEADER = ("| rate | compressor | rank | iteration | ms | forward + backward ms | codec ms (all buckets) | "
                   "codec on the critical path ms | wire ms | exposed ms |\n|---|---|---|---|---|---|---|---|---|---|")


def timeline_rows(results: Path, rows: list[dict], loopback: bool) -> list[str]:
    """Per ok trial with a timeline and per rank: its median iteration (testbed.report.timeline), split into the
    lanes, in ms; "-" where a lane was not marked (built-in sync SGD has no hook)."""
    from testbed.errors import InputError
    from testbed.report.timeline import kept_iteration, load, median_iteration, trial_dir

    def ms(x) -> str:
        return "-" if x is None else f"{x * 1e3:.1f}"

    out = []
    for r in rows:
        if r.get("status") != "ok" or not r.get("timeline_iters"):
            continue
        label = rate_label(r.get("rate_bps"), loopback)
        try:
            docs = load(trial_dir(results, r["trial_id"], r.get("attempt")))
            k = median_iteration(docs)
        except InputError as e:
            out.append(f"| {label} | {r['compressor']} | - | no timeline: {e} | - | - | - | - | - | - |")
            continue
        for d in docs:
            it = kept_iteration(d, k)
            ov = it["overlap"]
            compute = it["backward_window_s"][1]
            codec = sum(s["end_s"] - s["start_s"] for s in it["spans"] if s["lane"] == "codec")
            out.append(f"| {label} | {r['compressor']} | {d['rank']} | {k} | {ms(it['iter_time_s'])} | {ms(compute)} | "
                       f"{ms(codec)} | {ms(ov['codec_critical_s'])} | {ms(ov['comm_wire_s'])} | "
                       f"{ms(ov['comm_exposed_s'])} |")  # fmt: skip
    return out


def skipped_row(label: str, compressor: str, why: str) -> str:
    return f"| {label} | {compressor} | - | skipped: {why} | - | - | - | - | - | - |"


def write_tarball(out: Path, work: Path, md: Path) -> Path:
    tar_path = out / "gpu-check.tar.gz"
    tmp = out / ".gpu-check.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        if work.is_dir():
            tar.add(work, arcname="gpu-check")
        if md.is_file():
            tar.add(md, arcname="gpu-check/gpu-check.md")
    tmp.replace(tar_path)
    return tar_path


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--compressors", default="syncsgd,powersgd")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup-iters", type=int, default=5)
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="keep the marks of each trial's last N measured iterations (`testbed run --timeline`) and "
                         "print where the median one went per rank (default 0: none)")
    ap.add_argument("--backend", default="nccl", help=argparse.SUPPRESS)  # gloo: the CPU smoke test of this script
    ap.add_argument("--out", default=None, help="where the tables and the tarball go (default: a temporary folder)")
    ap.add_argument("--deadline", type=float, default=540.0,
                    help="seconds the whole check may take; every stage fits in what is left (default %(default)s)")
    ap.add_argument("--trial-timeout", type=float, default=TRIAL_S, help="seconds per trial (default %(default)s)")
    ap.add_argument("--name", default=NAME, help="cluster name for the emulated hosts (default gpuchk)")
    ap.add_argument("--no-model", action="store_true", help="leave out the calibration, profile and prediction")
    ap.add_argument("--calibrate-sizes", default="256kb,4mb,16mb,64mb",
                    help="message sizes of the calibrations (default: %(default)s)")
    ap.add_argument("--calibrate-reps", type=int, default=3, help="timed repetitions per size (default: %(default)s)")
    ap.add_argument("--calibrate-probe-s", type=float, default=DEFAULT_PROBE_S,
                    help="seconds of training steps per contention measurement (default: %(default)g)")
    # the fail-fast test: rank R of the first preflight exits 3 at init (the retry over loopback runs clean)
    ap.add_argument("--fail-preflight-rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from testbed.errors import InputError

    if not (args.deadline > 0 and args.deadline < float("inf")):
        raise InputError(f"--deadline {args.deadline:g}: expected a positive number of seconds")
    if not (args.trial_timeout > 0 and args.trial_timeout < float("inf")):
        raise InputError(f"--trial-timeout {args.trial_timeout:g}: expected a positive number of seconds")
    if not 0 <= args.timeline <= args.iters:
        raise InputError(f"--timeline {args.timeline}: expected 0 to --iters ({args.iters}) measured iterations")
    deadline = Deadline(args.deadline)
    sys.stdout.reconfigure(line_buffering=True)  # what is printed survives a run cut off at the device's time limit
    if not args.no_model:
        from testbed.calibrate import check_settings
        from testbed.model_cli import parse_sizes

        sizes = parse_sizes(args.calibrate_sizes, "--calibrate-sizes")  # an error now, not after the trials
        check_settings(sizes, args.calibrate_reps, 180, sizes_flag="--calibrate-sizes", reps_flag="--calibrate-reps",
                       probe_s=args.calibrate_probe_s, probe_flag="--calibrate-probe-s")  # fmt: skip
    from shaping.units import parse_rate_bps

    wanted_rates = [parse_rate_bps(r) for r in args.rates.split(",")]
    compressors = args.compressors.split(",")

    facts = cuda_facts() if args.backend == "nccl" else {"backend": "gloo (CPU smoke run)"}
    if facts is None:
        print("no CUDA device: skipped")
        return 0
    if "error" in facts:
        print(f"no usable torch: {facts['error']}: skipped")
        return 0
    if args.backend == "nccl":
        os.environ.setdefault("NCCL_DEBUG", "WARN")  # forwarded to the ranks (NCCL_*): what NCCL says on failure

    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-work-"))
    o = Output(out, work)
    stop = {"signal": None}

    main_pid = os.getpid()

    def on_signal(signum, frame):  # SIGTERM (a runner's time limit): end as Ctrl-C does, through the finally
        if os.getpid() != main_pid:  # a forked helper (pyroute2 forks to work in a namespace): die as by default
            os._exit(128 + signum)
        stop["signal"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    failures: list[str] = []
    try:
        failures += run_check(args, deadline, o, facts, wanted_rates, compressors, work)  # stages 2-5
    except KeyboardInterrupt:
        failures.append(f"interrupted ({'SIGTERM' if stop['signal'] else 'Ctrl-C'})")
        o.say("interrupted: cleaning up and writing what there is")
    finally:
        o.table(f"\n{'; '.join(_unique(failures)) if failures else 'all stages ran and passed'}; "
                f"{deadline.elapsed():.0f} s of {args.deadline:.0f}")  # fmt: skip
        o.close()
        tar = write_tarball(out, work, o.md_path)
        shutil.rmtree(work, ignore_errors=True)
        print(f"tables: {o.md_path}; everything: {tar}", file=sys.stderr)
    return 1 if failures else 0


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def run_check(args, deadline: Deadline, o: Output, facts: dict, wanted_rates, compressors, work: Path) -> list[str]:
    """Stages 2-5; returns what failed or was skipped (empty: everything ran and passed)."""
    failures: list[str] = []
    o.table(f"## GPU check, {dt.date.today().isoformat()}, {platform.node()}\n")
    o.table("| fact | value |\n|---|---|")
    for k, v in facts.items():
        o.table(f"| {k} | {v} |")
    gpus = list(range(facts.get("gpus", 0)))
    from testbed.gpus import assign_gpus

    per_host = assign_gpus(gpus, 2)
    o.table(f"| GPUs per emulated host | {per_host} |")

    o.table("\n| capability | works | how we know |\n|---|---|---|")
    caps = capabilities(args.name, work, o.say)
    for key in ("namespace", "veth", "HTB", "ip", "iperf3"):
        ok, why = caps[key]
        o.table(f"| {key} | {'yes' if ok else 'no'} | {why} |")
    netns_ok = caps["namespace"][0] and caps["veth"][0]
    shaped = netns_ok and caps["HTB"][0]

    cluster = None
    loopback = not netns_ok
    why_loopback = "" if netns_ok else f"namespaces or veth do not work here ({caps['namespace'][1]})"
    try:
        if netns_ok:
            try:
                from testbed.cluster.local import LocalCluster

                cluster, _ = LocalCluster.up(args.name, 2, gpus=gpus, recreate=True)
            except Exception as e:  # noqa: BLE001
                loopback, why_loopback = True, f"bringing the emulated hosts up failed: {type(e).__name__}: {e}"
        if loopback:
            o.say(f"using loopback: {why_loopback}")
            cluster = LoopbackCluster(args.name, per_host)

        # 3. preflight: two ranks, one 1 MB all-reduce, through the product's launch path
        what = f"{'NCCL sockets' if args.backend == 'nccl' else 'gloo'} preflight"
        budget = deadline.budget(PREFLIGHT_S, 15)
        preflight_ok, how = False, "skipped: no time left before the deadline"
        if budget is not None:
            where = "loopback" if loopback else "namespaces"
            res, how = run_allreduce(cluster, args.backend, work / f"preflight-{where}", 2**20, 1, budget, o,
                                     f"{what} ({where})", fail_rank=args.fail_preflight_rank, later=True)  # fmt: skip
            preflight_ok = res is not None
            if not preflight_ok and not loopback:
                failures.append(f"the preflight in namespaces failed ({how}); ran over loopback, unshaped")
                o.say(f"retrying the preflight over loopback, because: {how}")
                _remove(cluster, o)
                loopback, why_loopback, shaped = True, f"the preflight in namespaces failed: {how}", False
                cluster = LoopbackCluster(args.name, per_host)
                budget = deadline.budget(PREFLIGHT_S, 15)
                if budget is not None:
                    res, how = run_allreduce(cluster, args.backend, work / "preflight-loopback", 2**20, 1, budget, o,
                                             f"{what} (loopback)", later=True)  # fmt: skip
                    preflight_ok = res is not None
        where = "loopback sockets" if loopback else "the veth between namespaces"
        found = f"1 MB all-reduce over {where} ({how})" if preflight_ok else how
        if args.backend == "nccl":
            o.table(f"| NCCL sockets | {'yes' if preflight_ok else 'no'} | {found} |")
        else:
            o.table(f"| NCCL sockets | no | not tried (backend gloo); the gloo preflight: {found} |")
        o.flush_tails()  # the failed preflights' rank logs, after the capability table
        if loopback and why_loopback:
            o.table(f"\nloopback fallback (unshaped): {why_loopback}")
        rates = wanted_rates if shaped else [None]

        # 4. per rate: bus bandwidth, then the trials, each row as it finishes
        o.table("\n" + TRIAL_HEADER)
        rows: list[dict] = []
        if not preflight_ok:
            for rate in rates:
                for comp in compressors:
                    o.table(skipped_row(rate_label(rate, loopback), comp, "the preflight failed"))
            failures.append(f"preflight failed: {how}")
            return failures
        rows, trial_failures = run_trials(args, deadline, o, cluster, rates, compressors, loopback, shaped, caps,
                                          work)  # fmt: skip
        failures += trial_failures
        if args.timeline:
            o.table("\n" + TIMELINE_HEADER)
            for line in timeline_rows(work / "results", rows, loopback):
                o.table(line)

        # 5. the model on the same cluster
        if args.no_model:
            return failures
        o.table("\n## Performance model on this cluster: calibrated, profiled, predicted against the trials\n")
        profiles = work / "results" / "profiles"
        for rate in rates:
            budget = deadline.budget(CALIBRATION_S, 30)
            if budget is None:
                o.table(f"- calibration at {rate_label(rate, loopback)}: skipped: deadline")
                failures.append("calibration skipped at the deadline")
                continue
            try:
                o.table(calibrate_at(cluster, rate, profiles, args.backend, args.calibrate_sizes,
                                     args.calibrate_reps, budget, args.calibrate_probe_s))  # fmt: skip
            except Exception as exc:  # noqa: BLE001 (reported, and the check fails)
                o.table(f"- calibration at {rate_label(rate, loopback)} failed: {type(exc).__name__}: {exc}")
                failures.append("calibration failed")
        if not any(r["status"] == "ok" for r in rows):
            o.table("model check: skipped: no trial ran")
            failures.append("model check skipped")
            return failures
        if args.backend == "nccl":  # emulated hosts that share a GPU (assign_gpus: fewer GPUs than hosts)
            device, threads = "cuda", 0
            ranks_per_device = max(Counter(g[0] for g in per_host if g).values(), default=1)
        else:  # the CPU run: every rank shares this machine's cores
            device, threads = "cpu", cluster.threads_per_rank(len(per_host))
            ranks_per_device = len(per_host)
        budget = deadline.budget(600, 30)
        if budget is None:
            o.table("model check: skipped: deadline")
            failures.append("model check skipped at the deadline")
            return failures
        text = run_model_stage(args, work / "results", profiles, device, ranks_per_device, threads, budget)
        o.table(text)
        if text.startswith("model check failed"):
            failures.append("model check failed")
        return failures
    finally:
        if cluster is not None and not isinstance(cluster, LoopbackCluster):
            _remove(cluster, o)


def run_trials(args, deadline, o, cluster, rates, compressors, loopback, shaped, caps, work):
    from shaping.plan import LinkShape
    from testbed.config import Trial
    from testbed.launch import run_trial
    from testbed.results import ResultsStore

    store = ResultsStore(work / "results")
    rows, failures = [], []
    for rate in rates:
        label = rate_label(rate, loopback)
        busbw = None
        if args.backend == "nccl":
            budget = deadline.budget(TRIAL_S, 20)
            if budget is not None:
                try:
                    if rate is not None:
                        cluster.apply_shaping(LinkShape(rate), cluster.hosts())
                    res, how = run_allreduce(cluster, "nccl", work / f"busbw-{label.split()[0]}", 256 * 2**20, 5,
                                             budget, o, f"NCCL bus bandwidth at {label}")  # fmt: skip
                    busbw = res["busbw_bps"] if res else None
                    if res is None:
                        failures.append(f"busbw at {label} failed")
                finally:
                    if rate is not None:
                        cluster.clear_shaping(cluster.hosts())
        for comp in compressors:
            budget = deadline.budget(args.trial_timeout, 15, overhead_s=TRIAL_OVERHEAD_S)
            if budget is None:
                o.table(skipped_row(label, comp, "deadline"))
                failures.append("trials skipped at the deadline")
                continue
            trial = Trial(comp, rate, 2, model=args.model, image_size=args.image_size, batch_size=args.batch_size,
                          iters=args.iters, warmup_iters=args.warmup_iters, backend=args.backend, ranks_per_host=1,
                          cluster=args.name, timeline_iters=args.timeline,
                          options=(("rank", 4),) if comp in ("powersgd", "acpsgd") else ())  # fmt: skip
            try:
                row = run_trial(cluster, trial, store, timeout_s=budget, probe=shaped and caps["iperf3"][0])
            except Exception as e:  # noqa: BLE001 - one trial's failure is a row, not the end of the check
                row = {"status": "failed", "error": f"{type(e).__name__}: {e}", "compressor": trial.label()}
            rows.append(row)
            o.table(trial_row(row, busbw, label))
            if row["status"] != "ok":
                failures.append(f"{trial.label()} at {label}: {row['status']}")
                logs = sorted((work / "results").glob(f"trials/{trial.trial_id}*/logs/rank*.log"))
                if logs:
                    o.tails(f"{trial.label()} at {label}", logs[-2:])
    return rows, failures


def _remove(cluster, o: Output) -> None:
    if isinstance(cluster, LoopbackCluster):
        return
    from testbed.cluster.local import LocalCluster

    try:
        LocalCluster.remove(cluster.name)
    except Exception as e:  # noqa: BLE001 - said; `testbed down --name` removes what is left
        o.say(f"removing cluster {cluster.name} failed: {e}; `testbed down --name {cluster.name}`")


if __name__ == "__main__":
    from testbed.errors import InputError

    try:
        sys.exit(main())
    except InputError as exc:  # bad flags: one line, exit 2, nothing started
        print(f"gpu_check: {exc}", file=sys.stderr)
        sys.exit(2)
