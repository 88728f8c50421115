"""The performance model's work behind `testbed profile` and `testbed predict`: measure and store profiles, pick the
profile a prediction uses, and assemble a prediction as plain data. The CLI (model_cli.py) parses flags, calls one
of these and prints; the equations live in perfmodel/.

Measuring imports runners.profile (and torch) only when a measurement is asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shaping.files import atomic_write
from testbed import perfmodel as pm
from testbed import plugins
from testbed.errors import InputError, TestbedError

if TYPE_CHECKING:
    from testbed.cluster.base import Host
    from testbed.ranks import Starter

Status = Callable[[str], AbstractContextManager[Any]]  # e.g. rich's Console.status: shown while measuring


@dataclasses.dataclass(frozen=True)
class OnCluster:
    """Where a co-located profile's ranks run (measure_profile's `on`): `cluster` None is this machine, gloo over
    loopback; else that emulated cluster's first hosts. `on_start` is called with each process as it starts, and
    `stop` set (a signal) ends the ranks (measure_lockstep)."""

    cluster: Any = None
    on_start: Callable[[Any], None] | None = None
    stop: threading.Event | None = None


@contextlib.contextmanager
def _on_this_machine() -> Iterator[OnCluster]:
    yield OnCluster()


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
    lockstep_timeout_s: float = 1800.0,
    on: Callable[[], AbstractContextManager[OnCluster]] | None = None,
) -> pm.Profile:
    """Measure a profile on this machine (runners.profile): compute phases and each compressor's encode/decode.
    `threads` > 0 sets torch's thread count first, to measure compute as a rank of a trial runs it.
    `colocated` N > 1 measures again with N processes (each with `threads` threads) in lockstep, as N ranks that
    share this machine run (the local emulated cluster: its world size): compute, the slowest rank's lateness and,
    on CPU, each compressor's encode/decode in place (measure_lockstep, merge_lockstep).
    `options`: compressor -> its options; `plugin_path`: the directory MODULE:FACTORY plugins are imported from
    (this process imports them: the profile runs here). `lockstep_timeout_s`: how long the co-located ranks may take.
    `on` (`testbed profile --on NAME`): entered around the co-located measurement only (the solo one needs no
    cluster), it yields the emulated cluster whose first `colocated` hosts run the co-located ranks, gloo over their
    links (OnCluster; it holds the cluster's lease and clears its shaping while entered)."""
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

    names = compressors or list(pm.COMPRESSORS)
    with status(f"profiling {model} (batch {batch_size}, {device}, {iters} iterations per compressor)..."):
        data = measure(names, options)
    if colocated > 1:
        with (on or _on_this_machine)() as where, status(f"profiling {model} again as {colocated} co-located ranks in "
                                                          "lockstep..."):  # fmt: skip
            hosts = None if where.cluster is None else (where.cluster, where.cluster.hosts()[:colocated])
            shared = measure_lockstep(colocated, model, batch_size, names, options, image_size=image_size,
                                      seq_len=seq_len, iters=iters, bucket_cap_mb=bucket_cap_mb, threads=threads,
                                      device=device, plugin_path=plugin_path, timeout_s=lockstep_timeout_s, on=hosts,
                                      on_start=where.on_start, stop=where.stop)  # fmt: skip
        data = merge_lockstep(data, shared)
        if where.cluster is not None:
            data["colocated_on"] = where.cluster.name
    data["colocated_ranks"] = colocated
    return pm.profile_from_dict(data, source=f"profile of {model}")


def measure_lockstep(
    ranks: int,
    model: str,
    batch_size: int,
    names: list[str],
    options: dict[str, dict[str, Any]] | None,
    *,
    image_size: int | None,
    seq_len: int | None,
    iters: int,
    bucket_cap_mb: float,
    threads: int,
    device: str,
    plugin_path: str | None = None,
    timeout_s: float = 1800.0,
    fresh: bool = True,
    on: tuple[Starter, Sequence[Host]] | None = None,
    on_start: Callable[[Any], None] | None = None,
    stop: threading.Event | None = None,
) -> dict:
    """Run `ranks` processes of ``python -m runners.profile --lockstep-rank`` (a gloo group on a file store in a
    temporary folder) and return what rank 0 measured (runners.profile.lockstep), the compute in one launch and each
    compressor in a launch of its own (``pids``: part -> the processes that measured it): in place, each is the first
    model its processes train, as in a trial's fresh ranks. A process that has trained a model before runs ACP-SGD
    faster: 4 co-located resnet18 bs8 ranks, its backward about 40 ms shorter after the compute phase than in fresh
    processes (the first model's backward faulting in about 13,700 pages, 53 MB, each step, a later model's about 2),
    so measured after the compute its floors fell 12-16 % under its trials (seed 4, docs/performance-model.md).
    `fresh` False: one launch for everything, the compressors after the compute (as before 943e3ff; for comparison,
    bench/floor_vs_trial.py --warm). `on` (a cluster and `ranks` of its hosts; default None: this machine, gloo on
    loopback): rank r runs on host r, gloo on its data NIC, where a trial's ranks run (bench/floor_vs_trial.py
    --namespaced: over the emulated cluster's veths and switch, 3 resnet18 bs16 ranks' floor is 2-4 % above
    loopback's with sync SGD, 1-2 % with fp16).
    Each process is ended by its process group if it is still there when this returns or fails; `timeout_s` bounds
    the launches together. `on_start` is called with each process as it starts (to note it for whoever finishes the
    work after a SIGKILL of this process); `stop` set (a signal) ends the ranks and raises TestbedError."""
    if on is not None and len(on[1]) != ranks:
        raise InputError(f"measure_lockstep: {len(on[1])} host(s) given for {ranks} ranks; expected one host a rank")
    import time

    deadline = time.monotonic() + timeout_s
    parts = ([("compute", [], False)] + [(name, [name], True) for name in names] if fresh
             else [("all", list(names), False)])  # fmt: skip
    result: dict = {}
    codecs: dict = {}
    pids: dict = {}
    for part, part_names, codecs_only in parts:
        got = _lockstep_launch(ranks, model, batch_size, part_names, options, image_size=image_size, seq_len=seq_len,
                               iters=iters, bucket_cap_mb=bucket_cap_mb, threads=threads, device=device,
                               plugin_path=plugin_path, codecs_only=codecs_only, deadline=deadline,
                               timeout_s=timeout_s, on=on, on_start=on_start, stop=stop)  # fmt: skip
        pids[part] = got.pop("pids", [])
        codecs.update(got.pop("codecs", {}))
        if not codecs_only:
            result = got
    return {**result, "codecs": codecs, "pids": pids}


def _lockstep_launch(ranks: int, model: str, batch_size: int, names: list[str],
                     options: dict[str, dict[str, Any]] | None, *, image_size: int | None, seq_len: int | None,
                     iters: int, bucket_cap_mb: float, threads: int, device: str, plugin_path: str | None,
                     codecs_only: bool, deadline: float, timeout_s: float,
                     on: tuple[Starter, Sequence[Host]] | None = None, on_start: Callable[[Any], None] | None = None,
                     stop: threading.Event | None = None) -> dict:  # fmt: skip
    """One launch of the co-located profile's processes (measure_lockstep): rank 0's result."""
    from runners.contract import ProfileArgs
    from testbed.launch_plan import forwarded_env
    from testbed.ranks import THIS_MACHINE, Rank, running, watch

    with tempfile.TemporaryDirectory(prefix="gcprof-lockstep-") as tmp:
        out = Path(tmp) / "lockstep.json"
        # this machine's own processes: the controller's environment; on a cluster's hosts, what a trial's rank gets
        # from it (launch_plan's allowlist: no token or credential of the controller's)
        env = dict(os.environ) if on is None else forwarded_env(os.environ, emulated=True)
        # -P and a fixed working directory: a `runners/` or `json.py` where the user stands never runs (as root)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (plugins.plugin_pythonpath(plugin_path), env.get("PYTHONPATH")) if p)
        starts = []
        for r in range(ranks):
            args = ProfileArgs(model=model, batch_size=batch_size, out=str(out), compressors=tuple(names),
                               options=options or None, iters=iters, bucket_cap_mb=bucket_cap_mb, threads=threads,
                               device=device, image_size=image_size, seq_len=seq_len, lockstep_rank=r,
                               lockstep_world=ranks, init_method=f"file://{tmp}/store",
                               lockstep_codecs_only=codecs_only)  # fmt: skip
            host = THIS_MACHINE.host if on is None else on[1][r]
            # on a cluster's host: gloo on its data NIC (this machine's name resolves to no address in a namespace)
            rank_env = env if on is None else {**env, "GLOO_SOCKET_IFNAME": host.data_iface}
            starts.append(Rank(host, [*plugins.python_argv("-m", "runners.profile"), *args.to_argv()],
                               rank_env, Path(tmp) / f"rank{r}.log", Path(plugins.SAFE_CWD)))  # fmt: skip
        with running(THIS_MACHINE if on is None else on[0], starts, on_start=on_start) as procs:
            # until all are done or one failed: the others of a failed rank would wait for it in gloo for minutes
            watched = watch(procs, deadline=deadline, stop=stop)
            if watched.stopped:
                raise TestbedError("the co-located profile was stopped by a signal; its ranks were ended")
            if watched.timed_out:
                raise TestbedError(f"the co-located profile's ranks did not finish within {timeout_s:.0f} s")
        texts = [(Path(tmp) / f"rank{r}.log").read_text(errors="replace").strip() for r in range(ranks)]
        failed = [(r, c) for r, c in enumerate(watched.codes) if c]
        if failed or not out.exists():
            r, code = failed[0] if failed else (0, 0)
            last = texts[r].splitlines()[-1] if texts[r] else "no message"
            raise TestbedError(f"the co-located profile's rank {r} failed (exit {code}): {last}")
        return json.loads(out.read_text())


def merge_lockstep(solo: dict, lockstep: dict) -> dict:
    """A profile (`testbed.profile/1` dict) whose compute and codec costs are those of ranks measured together in
    lockstep (runners.profile.lockstep): forward / backward / optimizer, bucket readiness and the spread from the
    lockstep compute, ``lockstep_skew_s`` (median over steps of the slowest rank minus the median one), and per
    compressor measured in place: encode = its exposed encode, decode = its exposed decode plus what it lengthened
    backward by: backward with the compressor minus the longer of backward alone and backward beside sync SGD's
    built-in all-reduce (a plain collective's own host work stays the calibration's). Not capped by the rank's own
    callback CPU: co-located ranks share the cores, so a peer's decode lands beside this rank's backward too (4 ranks
    on 2 cores, Sign-SGD: backward 251 ms longer against 40 ms of its own callbacks' CPU beyond the exposed decode).
    Each bucket's solo encode / decode is scaled so that the totals are these. Compressors not measured in place
    (a plugin on CUDA) are scaled by the compute's slowdown. On CUDA the in-place codecs ran inside backward with
    their collectives the identity of one rank (runners.profile.lockstep), so their floors hold no network. Floors for the model at any rate (a link only adds to them):
    ``lockstep_comm_s``, the communication each compressor exposed in place, and ``lockstep_step_s``, its whole step
    in place (the slowest rank's, median over steps: a trial's iteration time on an unshaped link). Payload bytes and
    rounds stay the solo profile's."""
    ready = {int(k): float(v) for k, v in lockstep["ready_at_s"].items()}
    if set(ready) != {b["index"] for b in solo["buckets"]}:
        raise TestbedError(f"the co-located profile of {solo['model']} found other DDP buckets than the solo one")
    merged = {**solo, "compressors": {}}
    phases = ("forward_s", "backward_s", "optimizer_s")
    for key in phases:
        merged[key] = float(lockstep[key])
    merged["buckets"] = sorted(({**b, "ready_at_s": ready[b["index"]]} for b in solo["buckets"]),
                               key=lambda b: (b["ready_at_s"], b["index"]))  # fmt: skip
    merged["compute_jitter_s"] = float(lockstep["compute_jitter_s"])
    skew = [float(x) for x in lockstep.get("skew_s") or ()]
    if skew:
        merged["lockstep_skew_s"] = statistics.median(skew)
    merged["solo_compute_s"] = sum(float(solo[k]) for k in phases)  # co-location's slowdown: a term of its own
    slowdown = sum(merged[k] for k in phases) / max(1e-12, sum(float(solo[k]) for k in phases))
    codecs = lockstep.get("codecs") or {}
    plain_backward_s = max(merged["backward_s"], float((codecs.get("syncsgd") or {}).get("backward_s", 0.0)))
    for name, comp in solo["compressors"].items():
        in_place = codecs.get(name)
        enc_total = sum(b["encode_s"] for b in comp["buckets"])
        dec_total = sum(b["decode_s"] for b in comp["buckets"])
        if in_place is None:
            enc_k = dec_k = slowdown
        else:
            lengthened = max(0.0, in_place["backward_s"] - plain_backward_s)
            enc_k = in_place["encode_s"] / enc_total if enc_total > 0 else 1.0
            dec_k = (in_place["decode_s"] + lengthened) / dec_total if dec_total > 0 else 1.0
        floor = {} if in_place is None else {"lockstep_comm_s": float(in_place["comm_s"])}
        if in_place is not None and "step_s" in in_place:
            floor["lockstep_step_s"] = float(in_place["step_s"])
        merged["compressors"][name] = {
            **comp,
            **floor,
            "buckets": [{**b, "encode_s": b["encode_s"] * enc_k, "decode_s": b["decode_s"] * dec_k}
                        for b in comp["buckets"]],  # fmt: skip
        }
    return merged


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
        p = same[0]
        return p, str(directory / pm.profile_filename(p.model, p.batch_size, p.device, p.colocated_ranks))
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
) -> pm.ModelTerms | pm.TermsByRate:
    """The collective terms a prediction uses: `spec` a JSON path (that calibration), 'none' (the defaults), or
    'auto'/None (the ones stored in `profiles_dir` for this world size, see calibration.terms_for: interpolated by
    rate when there are several; the defaults when there is none). Latency / efficiency given override them."""
    if spec == "none":
        return pm.model_terms(None, latency_s=latency_s, efficiency=efficiency)
    if spec and spec != "auto":
        return pm.model_terms(pm.load_calibration(spec), latency_s=latency_s, efficiency=efficiency)
    found = pm.find_calibrations(profiles_dir)
    return pm.terms_for(found, world_size, latency_s=latency_s, efficiency=efficiency)


def explicit_calibrations(spec: str) -> list[pm.Calibration]:
    """`--calibration none` (no calibration) or a file: the calibrations a report uses instead of the stored ones."""
    return [] if spec == "none" else [pm.load_calibration(spec)]


def prediction(
    profile: pm.Profile,
    source: str,
    *,
    bandwidths_bps: list[float],
    world_size: int,
    baseline: str,
    compressors: list[str] | None = None,
    terms: pm.ModelTerms | pm.TermsByRate | None = None,
    compute_speedup: float = 1.0,
    codec_speedup: float = 1.0,
    hook_blocks_backward: bool = True,
) -> dict[str, Any]:
    """Everything `predict` shows, as plain data (its --json output): per compressor the predicted iteration time
    and speedup over `baseline` at each bandwidth, the best speedup and the crossover. `terms`: the collective
    terms (calibration.model_terms); default: the model's defaults, no calibration."""
    terms = terms or pm.model_terms(None)
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
        comm_rel_spread=terms.comm_rel_spread,
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
        "straggler_s": max((b.straggler_s for b in base), default=0.0),  # spread or lockstep skew, the larger
        "baseline": baseline,
        "bandwidths_bps": bandwidths_bps,
        # rates outside the calibrated ones: the terms there are the nearest calibration's (calibrate at them)
        "extrapolated_bps": [b for b in bandwidths_bps if terms.extrapolated(b)],
        **colocation(profile, world_size),
        "compressors": {},
    }
    for n in names:
        s = summary[n]
        cx = s.crossover
        out["compressors"][n] = {
            "iter_time_s": [p.iter_time_s for p in curves[n]],
            # the composition of the profile's phases before the in-place floors below (iter_time_s: the larger)
            "composed_s": [p.composed_s for p in curves[n]],
            # the term that decided each time (compute, co-location, codec, exposed communication, host cost, skew,
            # floor), the terms it is made of, the interval from the profile's and calibration's spread, the floor
            "bound_by": [p.bound_by for p in curves[n]],
            "breakdown_s": [dict(p.breakdown) for p in curves[n]],
            "low_s": [p.low_s for p in curves[n]],
            "high_s": [p.high_s for p in curves[n]],
            "floor_s": [p.floor_s for p in curves[n]],
            "floor_note": [p.floor_note for p in curves[n]],
            "speedup": [b.iter_time_s / p.iter_time_s for b, p in zip(base, curves[n], strict=True)],
            "max_speedup": s.max_speedup,
            "max_speedup_at_bps": s.at_bps,
            "assumed": list(prof.compressor(n).assumed),
            # the exposed communication measured in place with the ranks in lockstep: a floor at this world size
            "comm_floor_s": prof.compressor(n).lockstep_comm_s if prof.colocated_ranks == world_size > 1 else None,
            # and the whole step it took there: no rate makes a step shorter
            "step_floor_s": prof.compressor(n).lockstep_step_s if prof.colocated_ranks == world_size > 1 else None,
            "crossover": None
            if n == baseline
            else {"kind": cx.kind, "bandwidth_bps": cx.bandwidth_bps, "wins_below": cx.wins_below},
        }
    return out


def colocation(profile: pm.Profile, world_size: int) -> dict[str, Any]:
    """Which co-location the profile was measured at, against the trial's (a local cluster's ranks all share this
    machine: its world size), and the one-line warning when they differ."""
    measured, cores = profile.colocated_ranks, os.cpu_count() or 1
    warn = []
    if world_size > 1 and measured != world_size:
        warn.append(f"the profile was measured with {measured} rank(s) computing at once, the trial has {world_size} "
                    f"sharing this machine's {cores} cores: profile again with --colocated {world_size}")  # fmt: skip
    return {"profile_colocated_ranks": measured, "colocation": colocation_text(world_size, cores), "warnings": warn}


def colocation_text(ranks: int, cores: int, threads: int = 1) -> str | None:
    """'N ranks share M cores' when ranks x threads exceed the cores; None when they do not share."""
    return f"{ranks} ranks share {cores} cores" if ranks * max(1, threads) > cores else None
