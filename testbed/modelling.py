"""The performance model's work behind `testbed profile` and `testbed predict`: measure and store profiles, pick the
profile a prediction uses, and assemble a prediction as plain data. The CLI (model_cli.py) parses flags, calls one
of these and prints; the equations live in perfmodel.py.

Measuring imports runners.profile (and torch) only when a measurement is asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shaping.files import atomic_write
from testbed import calibration as cal
from testbed import perfmodel as pm
from testbed.errors import InputError, TestbedError

Status = Callable[[str], AbstractContextManager[Any]]  # e.g. rich's Console.status: shown while measuring


def _quiet(_: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def measure_profile(
    model: str,
    batch_size: int,
    compressors: list[str] | None,
    device: str,
    *,
    image_size: int | None = None,
    seq_len: int | None = None,
    iters: int = 10,
    bucket_cap_mb: float = 25.0,
    threads: int = 0,
    status: Status = _quiet,
    options: dict[str, dict[str, Any]] | None = None,
    plugin_path: str | None = None,
    colocated: int = 1,
) -> pm.Profile:
    """Measure a profile on this machine (runners.profile): compute phases and each compressor's encode/decode.
    `threads` > 0 sets torch's thread count first, to measure compute as a rank of a trial runs it.
    `colocated` N > 1 measures the compute phases again while N - 1 companion processes train the same model beside
    it (each with `threads` threads): compute as it runs when N ranks share this machine (the local emulated
    cluster: its world size); the compressors' encode/decode are timed alone and scaled by that compute slowdown.
    `options`: compressor -> its options; `plugin_path`: the directory MODULE:FACTORY plugins are imported from
    (this process imports them: the profile runs here)."""
    check_device(device)
    if plugin_path:
        import sys

        if plugin_path not in sys.path:
            sys.path.insert(0, plugin_path)
    try:
        from runners.profile import profile_model
    except ImportError as exc:
        raise TestbedError(f"cannot measure a profile here: runners.profile is not available ({exc})") from exc
    if threads:
        import torch

        torch.set_num_threads(threads)
    if colocated < 1:
        raise InputError(f"--colocated {colocated}: expected >= 1 (ranks computing at once on this machine)")

    def measure(names: list[str], opts: dict[str, dict[str, Any]] | None) -> dict:
        return profile_model(model, batch_size, names, image_size=image_size, seq_len=seq_len, iters=iters,
                             bucket_cap_mb=bucket_cap_mb, device=device, options=opts)  # fmt: skip

    with status(f"profiling {model} (batch {batch_size}, {device}, {iters} iterations per compressor)..."):
        data = measure(compressors or list(pm.COMPRESSORS), options)
    if colocated > 1:
        # compute (forward, backward, optimizer, bucket readiness) again with the companions beside it; the codecs
        # are not timed beside a companion (PowerSGD's encode came out 3x the trials': its world-size-1 hand-offs to
        # gloo's thread wait for a core) but scaled from their solo timings by the compute's own slowdown
        with (
            status(f"profiling {model}'s compute with {colocated - 1} companion rank(s) beside it..."),
            colocated_load(colocated - 1, model, batch_size, image_size, seq_len, threads, device) as load,
        ):
            shared = measure(["syncsgd"], None)
        if device == "cpu":
            check_companion_load(load, fair_share_cores(colocated, threads))
        solo_index = {b["index"] for b in data["buckets"]}
        if {b["index"] for b in shared["buckets"]} != solo_index:
            raise TestbedError(f"the co-located profile of {model} found other DDP buckets than the solo one")
        phases = ("forward_s", "backward_s", "optimizer_s")
        slowdown = sum(shared[k] for k in phases) / max(1e-12, sum(data[k] for k in phases))
        for key in (*phases, "buckets"):
            data[key] = shared[key]
        if not (device == "cpu" and oversubscribed(colocated, threads)):
            # the spread beside the companions is the trials' when every rank has cores of its own; when they
            # time-share cores it is the companions' phase (4 on 2 cores: 252 ms on a 0.84 s step), which ranks in
            # lockstep do not see: the solo spread stays
            data["compute_jitter_s"] = shared["compute_jitter_s"]
        for comp in data["compressors"].values():
            for b in comp["buckets"]:
                b["encode_s"] *= slowdown
                b["decode_s"] *= slowdown
    data["colocated_ranks"] = colocated
    return pm.profile_from_dict(data, source=f"profile of {model}")


@contextlib.contextmanager
def colocated_load(
    companions: int,
    model: str,
    batch_size: int,
    image_size: int | None,
    seq_len: int | None,
    threads: int,
    device: str,
    ready_timeout_s: float = 300.0,
):
    """`companions` processes (``python -m runners.profile --companion``) training `model` while the block runs;
    entered once every one of them says it is warm; each ended by its process group on the way out (they also exit
    when this process does)."""
    import selectors
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "runners.profile", "--companion", "--model", model, "--batch-size",
            str(batch_size), "--threads", str(threads), "--device", device]  # fmt: skip
    if image_size:
        argv += ["--image-size", str(image_size)]
    if seq_len:
        argv += ["--seq-len", str(seq_len)]
    procs: list[subprocess.Popen] = []
    # a companion's stderr goes to a file, not a pipe nobody reads while it trains: a full pipe would stop it
    errs = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally)
    try:
        for _ in range(companions):
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errs, text=True,
                                          start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + ready_timeout_s
        for proc in procs:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                line = proc.stdout.readline() if sel.select(max(0.0, deadline - time.monotonic())) else ""
            if line.strip() != "ready":
                proc.kill()
                errs.seek(0)
                err = errs.read().strip().splitlines()
                raise TestbedError(f"a companion of the co-located profile did not start: "
                                   f"{err[-1] if err else 'no word within ' + str(ready_timeout_s) + ' s'}")  # fmt: skip
        load = CompanionLoad()
        start_s, start_cpu = time.monotonic(), [process_cpu_s(p.pid) for p in procs]
        yield load
        load.wall_s = time.monotonic() - start_s
        load.cpu_s = [process_cpu_s(p.pid) - c for p, c in zip(procs, start_cpu, strict=True)]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        errs.close()


@dataclass
class CompanionLoad:
    """What the companions of a co-located profile did while it measured: wall time of the block, CPU seconds each."""

    wall_s: float = 0.0
    cpu_s: list[float] = field(default_factory=list)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (/proc/PID/stat); 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def fair_share_cores(colocated: int, threads: int) -> float:
    """Cores one of `colocated` processes gets on this machine: its threads (all cores when 0), at most an even share."""
    cores = os.cpu_count() or 1
    return min(float(threads or cores), cores / colocated)


def oversubscribed(colocated: int, threads: int) -> bool:
    """True when `colocated` processes of `threads` threads each (0: all cores) time-share this machine's cores."""
    cores = os.cpu_count() or 1
    return fair_share_cores(colocated, threads) < min(float(threads or cores), cores)


MIN_COMPANION_SHARE = 0.5  # a companion that computed less than half its fair share did not load the machine
MIN_CHECKED_WALL_S = 1.0  # shorter measurements are below the CPU clock's resolution: not checked


def check_companion_load(load: CompanionLoad, share_cores: float) -> None:
    """Refuse a co-located profile whose companions did not compute while it measured (stopped, starved or gone):
    it would be a solo profile under the co-located name. Measurements under MIN_CHECKED_WALL_S are not checked."""
    if load.wall_s < MIN_CHECKED_WALL_S:
        return
    expected = share_cores * load.wall_s
    idle = [c for c in load.cpu_s if c < MIN_COMPANION_SHARE * expected]
    if idle:
        got = ", ".join(f"{c / load.wall_s:.2f}" for c in load.cpu_s)
        raise TestbedError(
            f"the co-located profile's companions used {got} cores over its {load.wall_s:.1f} s measurement; "
            f"expected about {share_cores:.2g} each (at least {MIN_COMPANION_SHARE:.0%} of it): the measurement "
            "did not run beside their load, so it was not stored; run it again on a machine nothing else loads"
        )


def check_device(device: str) -> None:
    """--device cuda needs a GPU here (a measurement runs on this machine)."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise InputError(
            "--device cuda: no CUDA GPU is visible on this machine; use --device cpu, or profile on a GPU host "
            "and pass its JSON with `testbed predict --profile FILE`"
        )


def save_profile(profile: pm.Profile, directory: str | Path) -> Path:
    """Write `<model>-bs<batch>-<device>[-colocated<N>].json` atomically; returns the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / pm.profile_filename(profile.model, profile.batch_size, profile.device, profile.colocated_ranks)
    return atomic_write(path, json.dumps(pm.profile_to_dict(profile), indent=2))


def measure_and_store(
    model: str,
    batch_size: int,
    compressors: list[str] | None,
    device: str,
    directory: str | Path,
    **measure: Any,
) -> tuple[pm.Profile, Path]:
    """`testbed profile`: measure (see measure_profile for the keywords) and store; returns (profile, path)."""
    if batch_size < 1 or measure.get("iters", 10) < 1 or measure.get("threads", 0) < 0:
        raise InputError("--batch-size and --iters must be >= 1, --threads >= 0")
    profile = measure_profile(model, batch_size, compressors, device, **measure)
    return profile, save_profile(profile, directory)


def resolve_profile(
    *,
    profile_path: str | Path | None,
    model: str | None,
    batch_size: int,
    device: str,
    profiles_dir: str | Path,
    status: Status = _quiet,
) -> tuple[pm.Profile, str]:
    """The profile a prediction uses and where it came from: the file given, the one stored for (model, batch size,
    device) in `profiles_dir` (or another device's), or a fresh measurement that is stored there."""
    if profile_path:
        prof = pm.load_profile(profile_path)
        if model and model != prof.model:
            raise InputError(f"--model {model} but --profile {profile_path} is of {prof.model}; give one of them")
        return prof, str(profile_path)
    if not model:
        raise InputError("predict needs --model NAME (stored or measured profile) or --profile FILE")
    if batch_size < 1:
        raise InputError(f"--batch-size {batch_size}: expected >= 1")
    directory = Path(profiles_dir)
    exact = directory / pm.profile_filename(model, batch_size, device)
    if exact.is_file():
        return pm.load_profile(exact), str(exact)
    same = [p for p in pm.find_profiles(directory) if p.model == model and p.batch_size == batch_size]
    if same:
        return same[0], f"{directory}/{pm.profile_filename(same[0].model, same[0].batch_size, same[0].device)}"
    from runners import catalog
    from testbed.outputs import check_output_dir

    if model not in catalog.MODELS:  # a stored profile may be of any model; a measurement only of a known one
        raise InputError(f"--model {model!r}: unknown; accepted {', '.join(catalog.MODEL_NAMES)}")
    check_output_dir(directory, "--profiles")  # the measured profile is stored there
    prof = measure_profile(model, batch_size, None, device, status=status)
    path = save_profile(prof, directory)
    return prof, f"{path} (measured now)"


def resolve_terms(
    spec: str | None,
    profiles_dir: str | Path | None,
    world_size: int,
    *,
    latency_s: float | None = None,
    efficiency: float | None = None,
) -> cal.ModelTerms | cal.TermsByRate:
    """The collective terms a prediction uses: `spec` a JSON path (that calibration), 'none' (the defaults), or
    'auto'/None (the ones stored in `profiles_dir` for this world size, see calibration.terms_for: interpolated by
    rate when there are several; the defaults when there is none). Latency / efficiency given override them."""
    if spec == "none":
        return cal.model_terms(None, latency_s=latency_s, efficiency=efficiency)
    if spec and spec != "auto":
        return cal.model_terms(cal.load_calibration(spec), latency_s=latency_s, efficiency=efficiency)
    found = cal.find_calibrations(profiles_dir)
    return cal.terms_for(found, world_size, latency_s=latency_s, efficiency=efficiency)


def explicit_calibrations(spec: str) -> list[cal.Calibration]:
    """`--calibration none` (no calibration) or a file: the calibrations a report uses instead of the stored ones."""
    return [] if spec == "none" else [cal.load_calibration(spec)]


def prediction(
    profile: pm.Profile,
    source: str,
    *,
    bandwidths_bps: list[float],
    world_size: int,
    baseline: str,
    compressors: list[str] | None = None,
    terms: cal.ModelTerms | cal.TermsByRate | None = None,
    compute_speedup: float = 1.0,
    codec_speedup: float = 1.0,
    hook_blocks_backward: bool = True,
) -> dict[str, Any]:
    """Everything `predict` shows, as plain data (its --json output): per compressor the predicted iteration time
    and speedup over `baseline` at each bandwidth, the best speedup and the crossover. `terms`: the collective
    terms (calibration.model_terms); default: the model's defaults, no calibration."""
    terms = terms or cal.model_terms(None)
    model = terms.as_dict()
    if world_size < 1:
        raise InputError(f"--world-size {world_size}: expected >= 1")
    names = compressors or profile.compressor_names()
    if baseline not in names:
        names = [baseline, *names]
    available = profile.compressor_names()
    missing = [n for n in [*names, baseline] if n not in available]
    if missing:
        raise InputError(
            f"compressor(s) {', '.join(missing)} not in profile {source}; profiled: {', '.join(available)}"
        )
    prof = pm.what_if(profile, compute_speedup=compute_speedup, codec_speedup=codec_speedup)
    curves = pm.predict_curves(
        prof,
        world_size,
        bandwidths_bps,
        compressors=sorted(set(names) | {baseline}),
        hook_blocks_backward=hook_blocks_backward,
        terms=terms.function(max(1, world_size)),
    )
    summary = pm.summarize(
        prof,
        world_size,
        bandwidths_bps,
        baseline=baseline,
        compressors=names,
        hook_blocks_backward=hook_blocks_backward,
        terms=terms.function(max(1, world_size)),
    )
    base = curves[baseline]
    out: dict[str, Any] = {
        "profile": source,
        "model": profile.model,
        "batch_size": profile.batch_size,
        "device": profile.device,
        "world_size": world_size,
        **model,
        "calibration": terms.source,
        "compute_speedup": compute_speedup,
        "codec_speedup": codec_speedup,
        "hook_blocks_backward": hook_blocks_backward,
        "straggler_s": pm.straggler_s(prof.compute_jitter_s, world_size),
        "baseline": baseline,
        "bandwidths_bps": bandwidths_bps,
        "compressors": {},
    }
    for n in names:
        s = summary[n]
        cx = s.crossover
        out["compressors"][n] = {
            "iter_time_s": [p.iter_time_s for p in curves[n]],
            "speedup": [b.iter_time_s / p.iter_time_s for b, p in zip(base, curves[n], strict=True)],
            "max_speedup": s.max_speedup,
            "max_speedup_at_bps": s.at_bps,
            "assumed": list(prof.compressor(n).assumed),
            "crossover": None
            if n == baseline
            else {"kind": cx.kind, "bandwidth_bps": cx.bandwidth_bps, "wins_below": cx.wins_below},
        }
    return out
