"""GPU check: sync SGD vs PowerSGD over NCCL sockets between 2 emulated hosts on this machine's GPU(s).

    make gpu-check                  # = python3 bench/gpu_check.py (from the repository root)
    python3 bench/gpu_check.py --rates 1gbit,10gbit --model resnet50 --image-size 224

Runs the product's own path: `LocalCluster.up(..., gpus=...)` (one network namespace per emulated host, its GPU(s),
its own NCCL host id), `testbed.launch.run_trial` (tc shaping, iperf3 probe, the launch plan, NCCL over sockets on the
shaped veth) for syncsgd and powersgd (rank 4) at each rate, and an NCCL all-reduce bus bandwidth at each rate. Then
the performance model on the same cluster (`--no-model` leaves it out): `testbed calibrate` at each rate with the
trials' backend (on NCCL its contention probe runs a CNN on the GPU beside the collective: the SMs and copy engines
NCCL takes), a profile of the model on this machine's device (in lockstep when emulated hosts share a GPU), and the
report's predicted against measured iteration time per trial. Prints Markdown tables for docs/benchmarks.md.

Made for a bare GPU machine: its python3 brings torch (and pandas, pyarrow, psutil, rich); pure-Python wheels the
controller needs that are missing there (pyroute2) travel in .gpu-wheels/ (`make gpu-wheels`) and are put on sys.path
here. It first reports whether network namespaces, veth and HTB work; if they do not, it falls back to NCCL over
loopback sockets, unshaped (each emulated host keeps its own NCCL host id). Without iperf3 the rate is checked with
the NCCL bus bandwidth alone. Without CUDA it prints "no CUDA device: skipped" and exits 0. Needs root for namespaces.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), *sorted(glob.glob(str(REPO / ".gpu-wheels" / "*.whl")))]

NAME = "gpuchk"


def cuda_facts() -> dict | None:
    try:
        import torch
    except ImportError as e:
        return {"error": f"torch not importable: {e}"}
    if not torch.cuda.is_available():
        return None
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
             "gpu_name": torch.cuda.get_device_name(0)}  # fmt: skip
    try:
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        facts["nccl"] = f"unknown ({e})"
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()  # fmt: skip
        facts["driver"] = out[0] if out else None
    return facts


def netns_support(name: str) -> tuple[bool, str]:
    """Can this machine make namespaces joined by veth and shape them with HTB? (what the local cluster needs)"""
    try:
        from shaping.plan import LinkShape
        from testbed.cluster.local import LocalCluster

        cluster, _ = LocalCluster.up(name + "p", 2, shape=LinkShape(1_000_000_000))
        try:
            st = cluster.status()
            rate = st["hosts"][0]["links"]["upload"].get("rate_bps")
            if rate != 1_000_000_000:
                return False, f"HTB read back {rate}, not 1gbit"
        finally:
            LocalCluster.remove(name + "p")
        return True, "netns, veth, bridge and HTB work"
    except Exception as e:  # noqa: BLE001 - the finding is the point
        return False, f"{type(e).__name__}: {e}"


class LoopbackCluster:
    """Fallback when namespaces are not available: 2 'hosts' on 127.0.0.1, NCCL over loopback sockets, unshaped."""

    backend = "local"

    def __init__(self, gpus_per_host: list[list[int]]):
        from testbed.cluster.base import Host

        self.name = NAME
        self._hosts = [Host(f"h{i}", "127.0.0.1", "lo", None, gpus=tuple(g), emulated=True)
                       for i, g in enumerate(gpus_per_host)]  # fmt: skip

    def hosts(self):
        return list(self._hosts)

    def threads_per_rank(self, ranks_on_machine: int) -> int:
        return 0

    def rank_out_dir(self, local_dir, trial_id):
        return local_dir

    def recorded_shape(self):
        return None

    def apply_shaping(self, shape, hosts=None):
        raise RuntimeError("no shaping in loopback fallback")

    def clear_shaping(self, hosts=None):
        return None

    def fetch(self, host, remote_dir, local_dir):
        return None

    def start(self, host, argv, *, env, log_path, workdir=None):
        from testbed.cluster.local import LocalRankProcess

        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", os.defpath), **env}, cwd=workdir,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip
        return LocalRankProcess(host, popen, log_path)


def nccl_busbw(cluster, rate_bps: int | None, size_bytes: int = 256 * 2**20, reps: int = 5) -> float | None:
    """All-reduce bus bandwidth (bit/s) between the 2 hosts over NCCL sockets at the current shaping."""
    from testbed.config import Trial
    from testbed.launch import make_plan

    trial = Trial("syncsgd", rate_bps, 2, backend="nccl", ranks_per_host=1, cluster=cluster.name)
    logs = Path(tempfile.mkdtemp(prefix="busbw-"))
    # the same placement and environment (torchrun variables, NCCL socket settings, host ids) a trial's ranks get
    plan = make_plan(cluster, trial, logs, timeout_s=240)
    procs = []
    for r in plan.ranks:
        rank, h, env = r.rank, r.host, dict(r.env)
        argv = [sys.executable, str(REPO / "bench" / "allreduce_rank.py"), "--backend", "nccl", "--bytes",
                str(size_bytes), "--reps", str(reps), "--iface", h.data_iface]  # fmt: skip
        procs.append(cluster.start(h, argv, env=env, log_path=logs / f"r{rank}.log", workdir=REPO))
    try:
        for p in procs:
            p.wait(240)
    finally:
        for p in procs:
            p.kill_group()
    lines = [x for x in (logs / "r0.log").read_text().splitlines() if x.startswith("{")]
    if not lines:
        print(f"  busbw failed: {(logs / 'r0.log').read_text()[-600:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])["busbw_bps"]


def calibrate_at_rates(
    cluster, rates: list[int | None], profiles: Path, backend: str, sizes: str, reps: int
) -> list[str]:
    """`testbed calibrate` at each trial rate (None: unshaped), the trials' backend and placement; a line each."""
    from shaping.plan import LinkShape
    from shaping.units import format_rate
    from testbed.calibrate import run_calibration
    from testbed.model_cli import calibration_summary, parse_sizes

    lines = []
    for rate in rates:
        c, _ = run_calibration(cluster, profiles, shape=LinkShape(rate) if rate else None, unshaped=rate is None,
                               world_size=2, backend=backend, sizes_bytes=parse_sizes(sizes), reps=reps,
                               timeout_s=180)  # fmt: skip
        lines.append(f"- calibration at {format_rate(rate) if rate else 'unshaped'} ({c.backend}): "
                     f"{calibration_summary(c)}")  # fmt: skip
    return lines


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
    out.append("| rate | compressor | measured ms | predicted ms | error % |\n|---|---|---|---|---|")
    for _, e in errors.iterrows():
        out.append(f"| {e['bandwidth']} | {e['compressor']} | {e['measured_ms']:.1f} | {e['predicted_ms']:.1f} | "
                   f"{e['error_pct']:+.1f} |")  # fmt: skip
    out.append("\n| compressor | measured crossover | predicted | verdict |\n|---|---|---|---|")
    for _, c in crossovers.iterrows():
        out.append(f"| {c['compressor']} | {c['measured']} | {c['predicted']} | {c['verdict']} |")
    out += [f"- note: {n}" for n in res.notes]
    return "\n".join(out)


def print_trials(rows: list[dict], busbw: dict) -> None:
    """The trials' table (Markdown), one row per trial."""
    from shaping.units import format_rate

    print("| rate | compressor | backend | status | ms/iter (p50) | samples/s | wire tx MB/iter/host | "
          "probe goodput | NCCL busbw | device |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = r["rate_bps"] or None
        good = r["status"] == "ok"
        probe = r.get("measured_goodput_bps")
        bw = busbw.get(rate)
        print(
            f"| {format_rate(rate) if rate else 'unshaped (lo)'} | {r['compressor']} | {r.get('dist_backend')} | "
            f"{r['status']}{': ' + str(r['error'])[:120] if not good else ''} | "
            f"{r['iter_time_s_p50'] * 1e3:.1f} | {r['samples_per_s']:.1f} | "
            f"{(r['wire_tx_bytes_per_iter'] or 0) / 1e6:.2f} | "
            f"{format_rate(probe) if probe else '-'} | {format_rate(bw) if bw else '-'} | {r.get('device_name') or '-'} |"
            if good
            else f"| {format_rate(rate) if rate else 'unshaped (lo)'} | {r['compressor']} | - | {r['status']}: "
            f"{str(r['error'])[:160]} | - | - | - | - | - | - |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--compressors", default="syncsgd,powersgd")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup-iters", type=int, default=5)
    ap.add_argument("--backend", default="nccl", help=argparse.SUPPRESS)  # gloo: the CPU smoke test of this script
    ap.add_argument("--out", default=None, help="results directory (default: a temporary one)")
    ap.add_argument("--name", default=NAME, help="cluster name for the emulated hosts (default gpuchk)")
    ap.add_argument("--no-model", action="store_true", help="leave out the calibration, profile and prediction")
    ap.add_argument("--calibrate-sizes", default="256kb,4mb,16mb,64mb",
                    help="message sizes of the calibrations (default: %(default)s)")
    ap.add_argument("--calibrate-reps", type=int, default=3, help="timed repetitions per size (default: %(default)s)")
    args = ap.parse_args()
    started = time.monotonic()
    sys.stdout.reconfigure(line_buffering=True)  # what is printed survives a run cut off at the device's time limit
    if not args.no_model:
        from testbed.calibrate import check_settings
        from testbed.model_cli import parse_sizes

        sizes = parse_sizes(args.calibrate_sizes, "--calibrate-sizes")  # an error now, not after the trials
        check_settings(sizes, args.calibrate_reps, 180, sizes_flag="--calibrate-sizes", reps_flag="--calibrate-reps")

    facts = cuda_facts() if args.backend == "nccl" else {"backend": "gloo (CPU smoke run)"}
    if facts is None:
        print("no CUDA device: skipped")
        return 0
    if "error" in facts:
        print(f"no usable torch: {facts['error']}: skipped")
        return 0
    from shaping.units import parse_rate_bps
    from testbed.cluster.local import LocalCluster, assign_gpus
    from testbed.config import Trial
    from testbed.launch import run_trial
    from testbed.results import ResultsStore

    print(f"## GPU check, {dt.date.today().isoformat()}, {platform.node()}\n")
    print("| fact | value |\n|---|---|")
    for k, v in facts.items():
        print(f"| {k} | {v} |")
    gpus = list(range(facts.get("gpus", 0)))
    per_host = assign_gpus(gpus, 2)
    ok, why = netns_support(args.name)
    print(f"| netns + veth + HTB | {'yes' if ok else 'no'}: {why} |")
    iperf = shutil.which("iperf3") is not None
    print(f"| iperf3 | {'yes' if iperf else 'no (rates checked with NCCL busbw only)'} |")
    print(f"| GPUs per emulated host | {per_host} |\n")

    rates = [parse_rate_bps(r) for r in args.rates.split(",")] if ok else [None]
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-check-"))
    store = ResultsStore(out)
    rows = []
    busbw: dict[int | None, float | None] = {}
    profiles = out / "profiles"
    calibrations: list[str] = []
    model_failed = ""
    if ok:
        cluster, _ = LocalCluster.up(args.name, 2, gpus=gpus, recreate=True)
    else:
        cluster = LoopbackCluster(per_host)
    try:
        for rate in rates:
            if args.backend == "nccl":
                if rate is not None:
                    from shaping.plan import LinkShape

                    cluster.apply_shaping(LinkShape(rate), cluster.hosts())
                try:
                    busbw[rate] = nccl_busbw(cluster, rate)
                finally:
                    if rate is not None:
                        cluster.clear_shaping(cluster.hosts())
            for comp in args.compressors.split(","):
                trial = Trial(comp, rate, 2, model=args.model, image_size=args.image_size,
                              batch_size=args.batch_size, iters=args.iters, warmup_iters=args.warmup_iters,
                              backend=args.backend, ranks_per_host=1, cluster=args.name,
                              options=(("rank", 4),) if comp in ("powersgd", "acpsgd") else ())  # fmt: skip
                row = run_trial(cluster, trial, store, timeout_s=300, probe=ok and iperf)
                rows.append(row)
                print(f"  {trial.label()}: {row['status']} {row.get('error') or ''}", file=sys.stderr)
        print_trials(rows, busbw)  # before the calibrations: a run cut off at the device's limit keeps it
        if not args.no_model:
            try:  # a failure here must not cost the trials' table above
                calibrations = calibrate_at_rates(cluster, rates, profiles, args.backend, args.calibrate_sizes,
                                                  args.calibrate_reps)
            except Exception as exc:  # noqa: BLE001 (reported, and the check fails)
                model_failed = f"calibration failed: {type(exc).__name__}: {exc}"
    finally:
        if ok:
            LocalCluster.remove(args.name)

    if not args.no_model and not model_failed:
        print("\n## Performance model on this cluster: calibrated, profiled, predicted against the trials\n")
        print("\n".join(calibrations) + "\n")
        if args.backend == "nccl":  # emulated hosts that share a GPU (assign_gpus: fewer GPUs than hosts)
            device, threads = "cuda", 0
            ranks_per_device = max(Counter(g[0] for g in per_host if g).values(), default=1)
        else:  # the CPU run: every rank shares this machine's cores
            device, threads = "cpu", cluster.threads_per_rank(len(per_host))
            ranks_per_device = len(per_host)
        try:
            print(model_check(args, out, profiles, device, ranks_per_device, threads))
        except Exception as exc:  # noqa: BLE001 (reported, and the check fails)
            model_failed = f"model check failed: {type(exc).__name__}: {exc}"
    if model_failed:
        print(f"\n{model_failed}")
    print(f"\n{len(rows)} trials in {time.monotonic() - started:.0f} s; rows in {out}")
    return 0 if rows and all(r["status"] == "ok" for r in rows) and not model_failed else 1


if __name__ == "__main__":
    from testbed.errors import InputError

    try:
        sys.exit(main())
    except InputError as exc:  # bad flags: one line, exit 2, nothing started
        print(f"gpu_check: {exc}", file=sys.stderr)
        sys.exit(2)
