"""Single-process profile of a model and of compressors, for the performance model (testbed/perfmodel.py).

``profile_model(...)`` runs on one rank (a world-size-1 gloo group on a FileStore when no group exists; on CUDA no
collective runs at all: DDP's hook and the codecs' collectives are the identity they are on one rank), measures
forward / backward / optimizer medians, DDP's buckets (in reduction order, with the time after backward start at
which DDP hands each to the hook), and, per compressor, each bucket's payload bytes and encode / decode medians
(by running the compressor's hook on copies of the real gradient buckets), and ``compute_jitter_s``, the
iteration-to-iteration spread of forward + backward + optimizer (1.4826 x median absolute deviation): what makes
the slowest of p synchronised ranks slower than the typical one. Format: ``testbed.profile/1``.

CLI: ``python -m runners.profile --model resnet18 --batch-size 32 --compressors syncsgd,powersgd --out p.json``.
``python -m runners.profile --lockstep-rank R --lockstep-world N --init-method file://PATH ...``: one of the N
processes of a co-located profile (`testbed profile --colocated N` starts them; ``lockstep``): compute in lockstep
and each compressor's encode / decode measured in place while every process trains with it; rank 0 writes --out.
testbed.modelling.measure_lockstep launches the compute and each compressor in processes of their own
(``--lockstep-codecs-only``): each the first model its processes train, as in a trial's fresh ranks.
On CUDA the codecs in place run inside backward as a GPU trial runs them, their collectives the identity of one rank
(gloo's collectives on CUDA tensors are not what a GPU trial runs): the solo profile's codec times, taken with the GPU
otherwise idle, counted the gaps while the CPU launched PowerSGD's small kernels (45 ms against 15-19 ms in a trial's
timeline on an H200, docs/benchmarks.md "GPU check").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import statistics
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from runners import compressors as registry
from runners.buckets import BucketRecorder
from runners.compressors.base import FlatBucket, completed_future
from runners.models import build, make_optimizer
from runners.timing import Clock, last_grad_marks, lockstep_skew, slowest_rank_steps
from runners.train import PHASES

SCHEMA = "testbed.profile/1"


def profile_model(
    model: str,
    batch_size: int,
    compressors: list[str],
    *,
    image_size: int | None = 64,
    seq_len: int | None = 128,
    iters: int = 5,
    bucket_cap_mb: float = 25,
    options: dict[str, dict] | None = None,
    device: str = "cpu",
) -> dict:
    """Profile ``model`` and each compressor in ``compressors``. See the module docstring for the format."""
    names = list(compressors)
    image_size = 64 if image_size is None else image_size  # None: the model's default input size
    seq_len = 128 if seq_len is None else seq_len
    return _profile(model, batch_size, list(names), image_size, seq_len, iters, bucket_cap_mb, options or {}, device)


def _validate(model, batch_size, names, iters, bucket_cap_mb, options, device):
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size} is not accepted: expected >= 1")
    if iters < 1:
        raise ValueError(f"iters {iters} is not accepted: expected >= 1")
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb {bucket_cap_mb} is not accepted: expected > 0")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not accepted: expected 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is visible")
    for key in options:
        if key not in names:
            raise ValueError(f"options given for {key!r}, which is not among the compressors {names}")
    states = {}
    for name in names:
        states[name] = registry.get(name, **options.get(name, {}))  # raises ValueError on bad names/options
    return states


def _profile(model, batch_size, names, image_size, seq_len, iters, bucket_cap_mb, options, device) -> dict:
    states = _validate(model, batch_size, names, iters, bucket_cap_mb, options, device)
    own_group = not dist.is_initialized()
    tmp = None
    if own_group:
        tmp = tempfile.mkdtemp(prefix="gcprof-")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                timeout=timedelta(seconds=60))  # fmt: skip
    elif dist.get_world_size() != 1:
        raise ValueError(f"profile_model runs on one rank; the current process group has {dist.get_world_size()}")
    try:
        return _run(model, batch_size, names, states, image_size, seq_len, iters, bucket_cap_mb, device)
    finally:
        if own_group:
            dist.destroy_process_group()
            try:
                os.remove(f"{tmp}/store")
            except OSError:
                pass
            os.rmdir(tmp)


def _run(model, batch_size, names, states, image_size, seq_len, iters, bucket_cap_mb, device) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    clock = Clock(dev)
    spec = build(model, batch_size, image_size=image_size, seq_len=seq_len, device=dev)
    ddp = DDP(spec.module, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=True)  # fmt: skip
    recorder = BucketRecorder(clock)
    base_state, base_hook = registry.get("syncsgd", builtin=False)
    # CUDA: no collective at all (gloo would copy every bucket to the host and back, inside backward)
    ddp.register_comm_hook(base_state, recorder.wrap(identity_hook if dev.type == "cuda" else base_hook))
    opt = make_optimizer(ddp.parameters(), 1e-3)
    fwd, bwd, optim, ready = [], [], [], {}
    step, total = 0, 2 + iters
    while step < total:  # 2 unmeasured: DDP rebuilds its buckets after iteration 1
        t0, t1, t2, t3 = timed_step(spec, ddp, opt, clock, step)
        if step == 1:
            total = 2 + measured_steps(iters, clock.seconds(t0, t3))
        step += 1
        if step > 2:
            fwd.append(clock.seconds(t0, t1))
            bwd.append(clock.seconds(t1, t2))
            optim.append(clock.seconds(t2, t3))
            for info in recorder.buckets.values():
                ready.setdefault(info.index, []).append(clock.seconds(t1, info.ready_mark))
    # gradients of one real step, kept for the compressor runs
    x, y = spec.make_batch(0)
    spec.loss_fn(ddp(x), y).backward()
    infos = recorder.ordered()
    grads = [info.buffer.detach().clone() for info in infos]
    buckets = [
        {"index": info.index, "grad_bytes": g.numel() * g.element_size(), "numel": g.numel(),
         "ready_at_s": statistics.median(ready.get(info.index, [0.0]))}
        for info, g in zip(infos, grads, strict=True)
    ]  # fmt: skip
    buckets.sort(key=lambda b: (b["ready_at_s"], b["index"]))
    result = {
        "schema": SCHEMA,
        "model": model,
        "batch_size": batch_size,
        "image_size": spec.image_size,
        "seq_len": spec.seq_len,
        "device": dev.type,
        "torch_version": torch.__version__,
        "hostname": socket.gethostname(),
        "bucket_cap_mb": float(bucket_cap_mb),
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "optimizer_s": statistics.median(optim),
        "compute_jitter_s": robust_sd([a + b + c for a, b, c in zip(fwd, bwd, optim, strict=True)]),
        "buckets": buckets,
        "compressors": {},
    }
    for name in names:
        state, hook = states[name]
        # CUDA: the codecs' collectives as what they are on one rank, the identity (no gloo copy to the host); a
        # plugin's collectives go through gloo still (its byte counters wrap torch.distributed's own functions)
        local = dev.type == "cuda" and not hasattr(state, "inner")
        with local_collectives() if local else contextlib.nullcontext():
            result["compressors"][name] = profile_hook(state, hook, infos, grads, iters, clock)
    return result


def identity_hook(state, bucket) -> torch.futures.Future:
    """DDP's comm hook for a world of one rank without a collective: the average over one rank is the bucket."""
    return completed_future(bucket.buffer())


class _DoneWork:
    """What an async collective returns, for a collective that is the identity on one rank: already done."""

    def __init__(self, tensors: list) -> None:
        self._tensors = tensors

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        t = self._tensors[0]
        fut = torch.futures.Future(devices=[t.device]) if t.is_cuda else torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


@contextlib.contextmanager
def local_collectives():
    """All-reduce and all-gather as they are on a world of one rank (the identity, a copy for the gather; on a group
    of several, each slot of the gather gets this rank's part), with no process group involved: the solo profile on CUDA measures the codecs' compute, not gloo's device-to-host copies.
    Only for a process whose every collective meanwhile is on a world-size-1 group (the solo profile), or that needs
    the world group only for barriers and `agreed_steps` (the co-located profile's codecs in place on CUDA)."""
    from runners.compressors import base

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return _DoneWork([tensor]) if async_op else None

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        n = input_tensor.numel()  # every slot gets this rank's part (a group of several: as if all sent the same)
        output_tensor.view(-1, n).copy_(input_tensor.reshape(1, n).expand(output_tensor.numel() // n, n))
        return _DoneWork([output_tensor]) if async_op else None

    fake = {"all_reduce": all_reduce, "all_gather_into_tensor": all_gather_into_tensor,
            "all_gather_single": all_gather_into_tensor}  # fmt: skip
    saved = {name: getattr(dist, name) for name in fake if hasattr(dist, name)}
    saved_base = base.all_gather_single
    try:
        for name in saved:
            setattr(dist, name, fake[name])
        base.all_gather_single = all_gather_into_tensor
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        base.all_gather_single = saved_base


MIN_MEASURED_S = 2.0  # measure at least this much compute: a 40 ms step's median of 10 moves by a millisecond
MAX_MEASURED_STEPS = 500


def measured_steps(iters: int, step_s: float) -> int:
    """Steps to measure: `iters`, or more when they would take less than MIN_MEASURED_S (at most
    MAX_MEASURED_STEPS)."""
    if step_s <= 0:
        return iters
    return max(iters, min(MAX_MEASURED_STEPS, math.ceil(MIN_MEASURED_S / step_s)))


_world_all_reduce = dist.all_reduce  # agreed_steps' own: the CUDA codecs in place run under local_collectives


def agreed_steps(iters: int, step_s: float) -> int:
    """`measured_steps` agreed by every rank of the default group (the most any asks): each step has collectives or
    a barrier that the others must join."""
    n = torch.tensor([measured_steps(iters, step_s)], dtype=torch.int64)
    _world_all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def timed_step(spec, ddp, opt, clock: Clock, step: int) -> tuple:
    """One training step on batch `step`; clock marks before forward, after it, after backward and after the
    optimizer (the device synchronised at the end)."""
    x, y = spec.make_batch(step)
    t0 = clock.now()
    loss = spec.loss_fn(ddp(x), y)
    t1 = clock.now()
    loss.backward()
    t2 = clock.now()
    opt.step()
    opt.zero_grad(set_to_none=False)
    t3 = clock.now()
    clock.synchronize()
    return t0, t1, t2, t3


def robust_sd(xs: list[float]) -> float:
    """Standard deviation estimated from the median absolute deviation (1.4826 MAD): the spread of the typical
    iteration, not of a rare outlier (the trials report median iteration times). 0 with fewer than 3 samples."""
    if len(xs) < 3:
        return 0.0
    mid = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - mid) for x in xs)


def profile_hook(state, hook, infos, grads, iters: int, clock: Clock) -> dict:
    """Per-bucket payload bytes and encode/decode medians of one compressor, on copies of ``grads``."""
    state.stats.clock = clock
    if getattr(state, "builtin", False):
        per = [{"index": info.index, "payload_bytes": g.numel() * g.element_size(), "encode_s": 0.0,
                "decode_s": 0.0} for info, g in zip(infos, grads, strict=True)]  # fmt: skip
        return {"options": state.options(), "collective": state.COLLECTIVE, "rounds": state.ROUNDS, "buckets": per}
    calls = [0]
    if hasattr(state, "inner"):  # a plugin without the testbed's bookkeeping (runners.plugins.PluginAdapter)
        for name in ("step", "iter"):  # every step compressed, if the plugin counts its steps by a known name
            if isinstance(getattr(state.inner, name, None), int):
                setattr(state.inner, name, state.warmup_iters)
    else:
        state.iter = state.warmup_iters  # every step compressed (per-bucket memory starts empty, as after warm-up)
    samples: dict[int, dict[str, list]] = {}
    for _ in range(1 + iters):  # the first pass fills error feedback / warm-start memory, unmeasured
        state.stats.reset()
        futs = []
        for pos, (info, g) in enumerate(zip(infos, grads, strict=True)):
            fb = FlatBucket(info.index, g.clone(), info.shapes, pos == len(infos) - 1)
            futs.append(hook(state, fb))
        for f in futs:
            f.wait()
        clock.synchronize()
        totals = state.stats.collect()
        calls[0] = totals["collectives"]
        collected = totals["per_bucket"]
        for index, row in collected.items():
            s = samples.setdefault(index, {"payload_bytes": [], "encode_s": [], "decode_s": []})
            for k in s:
                s[k].append(row.get(k, 0))
    per = []
    for info in infos:
        s = samples[info.index]
        per.append({
            "index": info.index,
            "payload_bytes": int(round(statistics.fmean(s["payload_bytes"][1:] or s["payload_bytes"]))),
            "encode_s": statistics.median(s["encode_s"][1:] or s["encode_s"]),
            "decode_s": statistics.median(s["decode_s"][1:] or s["decode_s"]),
        })  # fmt: skip
    collective = getattr(state, "COLLECTIVE", None)
    rounds = getattr(state, "ROUNDS", None)
    out = {"options": state.options(), "collective": collective or "allreduce", "buckets": per,
           "rounds": rounds or max(1, round(calls[0] / max(1, len(infos))))}  # fmt: skip
    if hasattr(state, "inner"):
        from runners.plugins import assumed

        out["assumed"] = assumed(state.inner)
    return out


def lockstep(
    model: str,
    batch_size: int,
    compressors: list[str],
    *,
    rank: int,
    world_size: int,
    init_method: str,
    image_size: int,
    seq_len: int,
    iters: int = 5,
    bucket_cap_mb: float = 25,
    options: dict[str, dict] | None = None,
    device: str = "cpu",
    timeout_s: float = 300.0,
    local_codecs: bool | None = None,
    compute: bool = True,
) -> dict | None:
    """One of `world_size` co-located processes measuring together as the ranks of a trial on this machine run
    (`testbed profile --colocated N` starts them): returns, on rank 0, what they measured (None on the others).

    Compute in lockstep: every step starts after a barrier, each rank's DDP reduces on a world-size-1 group of its
    own (no communication beside the compute; on CUDA its hook is the identity, no collective at all): forward / backward / optimizer medians, bucket readiness, and per step
    how much later than the median rank the slowest one is done (``skew_s``, the wait a collective after backward
    sees). Codecs in place: per compressor (sync SGD as DDP's built-in all-reduce), every rank trains with it on the
    world group, as in a trial on an unshaped link; or, with `local_codecs` (the default on CUDA), every rank trains
    with it at once, each step started after a barrier, its collectives the identity of one rank (`local_collectives`:
    the codecs' kernels run inside backward beside the co-located ranks' as in a GPU trial, with no gloo copy to the
    host; a plugin's collectives are not replaced, so a plugin on CUDA is not measured in place); per step its phases
    as a trial splits them
    (``runners.train.step_phases``), the median over ranks and steps, and ``step_s``, the median over steps of the
    slowest rank's step (a trial's iteration time) (``codecs``: name -> phase -> seconds;
    testbed.modelling.merge_lockstep turns them into the profile's encode / decode and its floors). Payload bytes and
    rounds are not measured here (the solo profile has them).
    `compute` False: the codecs alone (no compute keys in the result). Whatever was measured, ``pids`` lists the
    processes that measured it: testbed.modelling.measure_lockstep measures the compute and each compressor in
    processes of their own, as a trial's fresh ranks run them (a process that has trained before runs ACP-SGD's step
    faster, see there)."""
    states = _validate(model, batch_size, compressors, iters, bucket_cap_mb, options or {}, device)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))  # fmt: skip
    try:
        own = [dist.new_group([r]) for r in range(world_size)][rank]  # every rank creates every group
        mine = None
        if compute:
            mine = _lockstep_compute(model, batch_size, image_size, seq_len, iters, bucket_cap_mb, dev, own)
        codecs = {}
        local = dev.type == "cuda" if local_codecs is None else local_codecs
        for name in compressors:
            state, hook = states[name]  # sync SGD built in: DDP's C++ all-reduce, as the trials run it
            if not local:
                codecs[name] = _lockstep_codec(model, batch_size, image_size, seq_len, iters, bucket_cap_mb, dev,
                                               state, hook)  # fmt: skip
            elif not hasattr(state, "inner"):  # gloo's collectives on CUDA tensors are not what a GPU trial runs
                with local_collectives():
                    codecs[name] = _lockstep_codec(model, batch_size, image_size, seq_len, iters, bucket_cap_mb, dev,
                                                   state, hook, own_group=own)  # fmt: skip
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, {"compute": mine, "codecs": codecs, "pid": os.getpid()})
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    out_codecs = {
        name: {
            **{k: statistics.median(x for g in gathered for x in g["codecs"][name][k]) for k in PHASES},
            "step_s": statistics.median(slowest_rank_steps([g["codecs"][name]["step_s"] for g in gathered])),
        }
        for name in codecs
    }
    out = {"world_size": world_size, "codecs": out_codecs, "pids": [g["pid"] for g in gathered]}
    if not compute:
        return out
    mine = gathered[0]["compute"]
    skew = lockstep_skew([g["compute"]["step_s"] for g in gathered])
    return {
        **out,
        "forward_s": statistics.median(mine["forward_s"]),
        "backward_s": statistics.median(mine["backward_s"]),
        "optimizer_s": statistics.median(mine["optimizer_s"]),
        "compute_jitter_s": robust_sd(mine["step_s"]),
        "ready_at_s": {index: statistics.median(ts) for index, ts in mine["ready_at_s"].items()},
        "skew_s": skew,
    }


def _lockstep_compute(model, batch_size, image_size, seq_len, iters, bucket_cap_mb, dev, own_group) -> dict:
    clock = Clock(dev)
    spec = build(model, batch_size, image_size=image_size, seq_len=seq_len, device=dev)
    ddp = DDP(spec.module, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=True, process_group=own_group)  # fmt: skip
    recorder = BucketRecorder(clock)
    base_state, base_hook = registry.get("syncsgd", process_group=own_group, builtin=False)
    ddp.register_comm_hook(base_state, recorder.wrap(identity_hook if dev.type == "cuda" else base_hook))
    opt = make_optimizer(ddp.parameters(), 1e-3)
    out: dict = {"forward_s": [], "backward_s": [], "optimizer_s": [], "step_s": [], "ready_at_s": {}}
    step, total = 0, 2 + iters
    while step < total:  # 2 unmeasured: DDP rebuilds its buckets after iteration 1
        dist.barrier()
        t0, t1, t2, t3 = timed_step(spec, ddp, opt, clock, step)
        if step == 1:
            total = 2 + agreed_steps(iters, clock.seconds(t0, t3))
        step += 1
        if step > 2:
            out["forward_s"].append(clock.seconds(t0, t1))
            out["backward_s"].append(clock.seconds(t1, t2))
            out["optimizer_s"].append(clock.seconds(t2, t3))
            out["step_s"].append(clock.seconds(t0, t3))
            for info in recorder.buckets.values():
                out["ready_at_s"].setdefault(info.index, []).append(clock.seconds(t1, info.ready_mark))
    return out


def _lockstep_codec(model, batch_size, image_size, seq_len, iters, bucket_cap_mb, dev, state, hook,
                    own_group=None) -> dict:  # fmt: skip
    """Per step, the phases of a rank's step (``runners.train.step_phases``: forward, backward, encode, comm,
    decode, optimizer; exposed time, as a trial reports them) and the whole step (``step_s``) while every rank
    trains with the compressor on the world group, or, with `own_group` (under `local_collectives`), each on a
    world-size-1 group of its own, every step started after a barrier of the world group."""
    from runners.compressors import attach
    from runners.train import step_phases

    clock = Clock(dev)
    state.stats.clock = clock
    spec = build(model, batch_size, image_size=image_size, seq_len=seq_len, device=dev)
    ddp = DDP(spec.module, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb,
              gradient_as_bucket_view=True, process_group=own_group)  # fmt: skip
    if own_group is not None and getattr(state, "builtin", False):
        # sync SGD's all-reduce on one rank: the bucket itself (unannotated: DDP checks a hook's return annotation)
        ddp.register_comm_hook(None, lambda state, bucket: identity_hook(state, bucket))
    else:
        attach(ddp, state, hook)
    last_grad = last_grad_marks(ddp.module, clock)
    opt = make_optimizer(ddp.parameters(), 1e-3)
    warmup = max(2, state.warmup_iters)  # every measured step compressed, buckets rebuilt
    out: dict[str, list[float]] = {k: [] for k in (*PHASES, "step_s")}
    try:
        step, total = 0, warmup + iters
        while step < total:
            if own_group is not None:
                dist.barrier()  # the world group's collectives start a trial's steps together; here the barrier
            state.stats.reset()
            t0, t1, t2, t3 = timed_step(spec, ddp, opt, clock, step)
            if step == warmup - 1:
                total = warmup + agreed_steps(iters, clock.seconds(t0, t3))
            step += 1
            if step > warmup:
                for k, v in step_phases(clock, state.stats, False, t0, t1, t2, t2, t3, last_grad[0]).items():
                    out[k].append(v)
                out["step_s"].append(clock.seconds(t0, t3))
    finally:
        close = getattr(state, "close", None)
        if close is not None:
            close()  # powersgd's communication worker, before the group goes
    return out


def main(argv=None) -> int:
    """One profile process; its command line is `runners.contract.ProfileArgs` (bad input: one line, exit 2)."""
    from runners.contract import ContractError, ProfileArgs
    from runners.files import atomic_write

    try:
        args = ProfileArgs.from_argv(sys.argv[1:] if argv is None else list(argv))
    except ContractError as e:
        print(f"profile: error: {e}", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        options = {name: dict(opts) for name, opts in (args.options or {}).items()}
        names = list(args.compressors)
        if args.lockstep_rank is not None:
            result = lockstep(args.model, args.batch_size, names, rank=args.lockstep_rank,
                              world_size=args.lockstep_world, init_method=args.init_method,
                              image_size=args.image_size, seq_len=args.seq_len, iters=args.iters,
                              bucket_cap_mb=args.bucket_cap_mb, options=options, device=args.device,
                              compute=not args.lockstep_codecs_only)  # fmt: skip
            if result is not None:
                atomic_write(args.out, json.dumps(result, indent=2) + "\n")
            return 0
        result = profile_model(args.model, args.batch_size, names, image_size=args.image_size,
                               seq_len=args.seq_len, iters=args.iters, bucket_cap_mb=args.bucket_cap_mb,
                               options=options, device=args.device)  # fmt: skip
    except ValueError as e:
        print(f"profile: error: {e}", file=sys.stderr)
        return 2
    atomic_write(args.out, json.dumps(result, indent=2) + "\n")
    print(f"profile: wrote {args.out}: {len(result['buckets'])} buckets, {len(names)} compressors", file=sys.stderr)
    return 0

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as runners.train: no C++ static destructors after a process group's store has gone
