"""Rank entry point: ``python -m runners.train`` (started by torchrun or the testbed launchers).

Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; trains a model with DDP and a compressor hook on
synthetic data; writes one JSON record per measured iteration to ``OUT/rank{RANK}.jsonl`` and, on rank 0,
``OUT/summary.json``. Bad input prints one line ``train: error: ...`` and exits 2 before any process group exists.

Phases (seconds, per iteration, all are *exposed* time on the training critical path, so they add up to
``iter_time_s``):
  forward_s    model forward + loss.
  backward_s   backward wall time minus the compressor's in-hook work and minus the exposed tail wait, i.e. the
               backward compute that communication did not hide.
  encode_s     compressor encode inside hooks (runs on the backward thread, so it is exposed).
  comm_s       time blocked on collectives: waits inside synchronous hooks + the tail from the later of
               (last gradient computed, last hook returned) to the end of ``loss.backward()``, where DDP waits for
               the outstanding all-reduces (for syncsgd/fp16/bf16, only this tail is exposed).
  decode_s     compressor decode on the critical path (inside hooks, or in a future callback that ran during the
               tail); decode that ran in a callback while backward was still computing is hidden and not counted.
  optimizer_s  optimizer step + zero_grad.
Not a phase: ``peer_wait_s`` (``--skew-probe`` only, else null): summed over this rank's collectives, how long it
was at the collective before the slowest peer joined (skew from uneven encode or compute, not wire time); it is
part of whatever comm_s shows when exposed.
In ``--serial`` mode backward runs under ``no_sync()`` (pure compute) and the buckets are then reduced by the same
hook, so backward_s is the full compute; in the reduction's wall time encode_s is the hooks' encoding, decode_s the
decoding outside it (a callback may decode on the communication thread while the next bucket encodes) and comm_s the
rest, the wait on the collectives (runners.train._serial_reduce_phases).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from runners.contract import ContractError, RankArgs, RankEnv
from runners.files import atomic_write
from runners.timeline import union

RECORD_KEYS = (
    "rank", "iter", "forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s", "iter_time_s",
    "samples", "payload_bytes", "wire_tx_bytes", "wire_rx_bytes", "peer_wait_s",
    "comm_wire_s", "comm_hidden_s", "comm_exposed_s", "codec_critical_s", "codec_hidden_s",
)  # fmt: skip
PHASES = ("forward_s", "backward_s", "encode_s", "comm_s", "decode_s", "optimizer_s")
OVERLAP = ("comm_wire_s", "comm_hidden_s", "comm_exposed_s", "codec_critical_s", "codec_hidden_s")  # timeline.py

InputError = ContractError  # bad flags or environment: one line, exit 2


@dataclasses.dataclass
class Job:
    """A validated rank: its arguments, its place in the job, the backend and the compressor (state, hook)."""

    args: RankArgs
    env: RankEnv
    backend: str
    state: Any
    hook: Any

    @property
    def options(self) -> dict[str, Any]:
        return self.args.option_dict


def build_parser():
    return RankArgs.parser()


def validate(argv) -> Job:
    """Everything that can be checked before a process group exists. Raises ContractError / ValueError."""
    from runners import compressors
    from runners.models import MODELS

    args = RankArgs.from_argv(argv)
    if args.model not in MODELS:
        raise InputError(f"unknown model {args.model!r}; valid: {', '.join(MODELS)}")
    _check_data(args)
    state, hook = compressors.get(args.compressor, overlap=args.overlap, **args.option_dict)  # ValueError if bad
    env = RankEnv.from_environ(os.environ)
    import torch

    cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise InputError("--backend nccl needs CUDA, and no CUDA device is visible; use --backend gloo")
    if backend == "nccl" and env.local_rank >= torch.cuda.device_count():
        raise InputError(
            f"LOCAL_RANK={env.local_rank} but this host shows {torch.cuda.device_count()} CUDA device(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    if args.iface is not None:
        import psutil

        if args.iface not in psutil.net_if_addrs():
            raise InputError(f"--iface {args.iface!r} does not exist; have: {', '.join(psutil.net_if_addrs())}")
    return Job(args, env, backend, state, hook)


def _check_data(args: RankArgs) -> None:
    """--data names a data set this model trains on, and its files are here (before any process group exists)."""
    from runners import catalog, datafiles

    try:
        catalog.check_data_model(args.data, args.model)
        entry, root = catalog.parse_data(args.data)
        datafiles.check(entry.kind, root)
    except ValueError as e:  # DataMissing included
        raise InputError(f"{e} (host {socket.gethostname()})") from None
    if args.eval_every is not None and entry.kind == "synthetic":
        raise InputError("--eval-every needs a real data set (--data fashion-mnist, cifar10:DIR or imagefolder:DIR)")


def iface_for(addr: str) -> str | None:
    """The local interface whose address routes to ``addr`` (for the wire counters)."""
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(addr), 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == local for a in addrs):
            return name
    return None


def percentile(values, q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run(job: Job) -> int:
    import torch
    import torch.distributed as dist

    args, env, backend = job.args, job.env, job.backend
    if args.iface:
        if backend == "gloo":
            os.environ["GLOO_SOCKET_IFNAME"] = args.iface
        else:  # NCCL over sockets on the data interface (the launcher sets these too; a bare torchrun gets them here)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "=" + args.iface)
            os.environ.setdefault("NCCL_IB_DISABLE", "1")
            os.environ.setdefault("NCCL_NET", "Socket")
    if args.threads:
        torch.set_num_threads(args.threads)
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=args.timeout_s),
                            device_id=device if device.type == "cuda" else None)  # fmt: skip
    WALL["group_ready"] = time.time()
    try:
        code = _train(job, device)
        job.state.close()  # powersgd's communication worker: idle (DDP waited for every bucket), stop and join it
        # Leave together: a gloo rank that tears its pairs down while a peer still talks to it can abort
        # ("terminate called without an active exception", seen with mstopk on 2 ranks).
        dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()
        return code
    finally:
        dist.destroy_process_group()


def _train(job: Job, device) -> int:
    import psutil
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors, timeline
    from runners.buckets import BucketRecorder, serial_reduce
    from runners.models import build, make_optimizer
    from runners.timeline import iteration_record, keep_iteration, marking_hook
    from runners.timing import Clock, last_grad_marks
    from runners.trace import Tracer

    args, state, hook = job.args, job.state, job.hook
    rank, world = job.env.rank, job.env.world_size
    timing = not args.no_timing
    clock = Clock(device, enabled=timing)
    iter_clock = Clock(device, enabled=True)  # iteration time is always measured
    state.stats.clock = clock

    source = None
    if args.data != "synthetic":  # real data: seeded shards (runners/data.py); channels and classes follow the data
        from runners.data import ShardedBatches, load

        source = load(args.data, args.image_size)
    spec = build(args.model, args.batch_size, seed=args.seed, rank=rank, device=device,
                 image_size=source.image_size if source else args.image_size, seq_len=args.seq_len,
                 **({"in_channels": source.channels, "num_classes": source.classes, "distinct_batches": 1}
                    if source else {}))  # fmt: skip
    if source is not None:
        spec.make_batch = ShardedBatches(source, rank=rank, world_size=world, batch_size=args.batch_size,
                                         seed=args.seed, device=device)  # fmt: skip
    dist.barrier()  # every rank has started and built its model: what is left is the model's sync alone
    WALL["model_built"] = time.time()
    sync = model_sync_mode(spec.module, device)  # "checksum": every rank built the same parameters, no broadcast
    model = DDP(spec.module, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True,
                init_sync=sync == "broadcast")  # fmt: skip
    WALL["model_synced"] = time.time()
    recorder = BucketRecorder(clock)
    serial_hook = hook
    if args.serial:
        if getattr(state, "builtin", False):
            serial_hook = compressors.syncsgd.syncsgd_hook
        model.register_comm_hook(state, recorder.wrap(marking_hook(serial_hook)))
    else:
        compressors.attach(model, state, marking_hook(hook))  # marks each bucket's ready time (runners/timeline.py)
    optimizer = make_optimizer(model.parameters(), args.lr)
    probe = None
    if args.skew_probe and not getattr(state, "builtin", False):  # builtin syncsgd has no hook to probe
        from runners.timing import SkewProbe, estimate_offsets

        probe_group = dist.new_group()
        offsets = estimate_offsets(probe_group, world, device=device)
        probe = state.stats.probe = SkewProbe(probe_group, world, rank, offsets, device=device)
    # --timeline-iters: the last N measured iterations' marks, with this rank's clock offset from rank 0's
    kept = collections.deque(maxlen=args.timeline_iters or None)
    if args.timeline_iters:
        from runners.timing import estimate_offsets

        timeline_offsets = probe.offsets.tolist() if probe is not None else estimate_offsets(None, world, device=device)
    tracer = Tracer(device, args.out, rank)  # --trace-iters: torch.profiler over the first N steps after warm-up

    # last-gradient marks: the end of backward compute (normal mode, timing on)
    last_grad = last_grad_marks(model.module, clock) if timing and not args.serial else [None]

    warmup = max(args.warmup_iters, state.warmup_iters, 2 if args.serial else 0)
    wire_if = args.iface or iface_for(job.env.master_addr)

    def wire():
        if wire_if is None:
            return None
        c = psutil.net_io_counters(pernic=True).get(wire_if)
        return (c.bytes_sent, c.bytes_recv) if c else None

    from runners.evaluation import Learning

    learning = Learning(module=model.module, source=source, eval_every=args.eval_every, target=args.target_accuracy,
                        rank=rank, world_size=world, device=device)  # fmt: skip
    total_steps = max(args.max_steps, warmup + 1) if args.max_steps else warmup + args.trace_iters + args.iters
    use_views = False
    records = []
    for step in range(total_steps):
        measured = step >= warmup
        if step == warmup:
            WALL["warm"] = time.time()
        if measured and args.serial and step == warmup:
            use_views = recorder.grads_are_views()
        if args.trace_iters and step in (warmup, warmup + args.trace_iters):
            tracer.start() if step == warmup else tracer.finish()
        x, y = spec.make_batch(step)
        state.stats.reset()
        last_grad[0] = None
        w0 = wire()
        it0 = iter_clock.now()
        t0 = it0 if timing else None  # one mark for both: the phases add up to the iteration by construction
        t0_wall = time.time()
        tracer.phase("forward")
        if args.serial and measured:
            with model.no_sync():
                loss = spec.loss_fn(model(x), y)
                t1 = clock.now()
                tracer.phase("backward")
                loss.backward()
            t2 = clock.now()
            tracer.phase("reduce")
            serial_reduce(state, serial_hook, recorder, use_views)
            t_red = clock.now()
        else:
            loss = spec.loss_fn(model(x), y)
            t1 = clock.now()
            tracer.phase("backward")
            loss.backward()
            t2 = clock.now()
            t_red = t2
        tracer.phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        t3 = clock.now()
        it1 = t3 if timing else iter_clock.now()
        tracer.phase(None)
        iter_clock.synchronize()
        w1 = wire()
        peer_wait = probe.collect() if probe is not None else None
        iter_time = iter_clock.seconds(it0, it1)
        # training time, evaluation every N steps (timed apart), the target stop (runners/evaluation.py)
        stop = learning.after_step(step, iter_time, loss, measured=len(records) + measured,
                                   last=step == total_steps - 1)  # fmt: skip
        if not measured or step < warmup + args.trace_iters:  # warm-up, or traced (runners/trace.py): not measured
            if stop:
                break
            continue
        payload = state.dense_bytes if getattr(state, "builtin", False) else state.stats.payload_bytes
        rec = {"rank": rank, "iter": len(records)}
        if timing:
            rec.update(step_phases(clock, state.stats, args.serial, t0, t1, t2, t_red, t3, last_grad[0]))
            marks = {"serial": args.serial, "t0": t0, "t1": t1, "t2": t2, "t_red": t_red, "t3": t3,
                     "last_grad": last_grad[0], "phases": dict(rec), "builtin": getattr(state, "builtin", False)}  # fmt: skip
            view = iteration_record(clock, state.stats, spans=False, **marks)
            rec.update(view["overlap"])
            if args.timeline_iters:  # the raw marks only (reset() makes new lists): lanes are drawn after the loop
                keep_iteration(kept, rec["iter"], t0_wall, iter_time, peer_wait, marks, state.stats)
        else:
            rec.update({k: None for k in PHASES + OVERLAP})
        rec.update({
            "iter_time_s": iter_time,
            "samples": args.batch_size,
            "payload_bytes": int(payload),
            "wire_tx_bytes": (w1[0] - w0[0]) if w0 and w1 else None,
            "wire_rx_bytes": (w1[1] - w0[1]) if w0 and w1 else None,
            "peer_wait_s": peer_wait,
        })  # fmt: skip
        records.append({k: rec[k] for k in RECORD_KEYS})
        if stop:
            break
    WALL["loop_done"] = time.time()
    WALL.setdefault("warm", WALL["loop_done"])
    learning.finish()
    tracer.finish()

    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, f"rank{rank}.jsonl"), "".join(json.dumps(r) + "\n" for r in records))
    if args.timeline_iters:
        kept_views = [{"iter": i, **iteration_record(clock, snap, spans=True, **marks), "t0_wall_s": t_wall,
                       "iter_time_s": it_s, "peer_wait_s": wait_s}
                      for i, t_wall, it_s, wait_s, marks, snap in kept]  # fmt: skip
        timeline.write(args.out, rank, world, timeline_offsets, kept_views,
                       {"compressor": args.compressor, "serial": args.serial, "overlap": args.overlap,
                        "device": device.type, "backend": job.backend})  # fmt: skip

    local = {
        "rank": rank,
        "iter_time_s": [r["iter_time_s"] for r in records],
        **{k: _mean([r[k] for r in records]) for k in PHASES + OVERLAP},
        "payload_bytes": _mean([r["payload_bytes"] for r in records]),
        "wire_tx_bytes": _mean([r["wire_tx_bytes"] for r in records]),
        "wire_rx_bytes": _mean([r["wire_rx_bytes"] for r in records]),
        "peer_wait_s": _mean([r["peer_wait_s"] for r in records]),
        "train_step_s": learning.step_times_s,  # every training step's time, warm-up included
    }
    gathered = [None] * world
    dist.all_gather_object(gathered, local)
    if rank == 0:
        summary = _summary(job, device, warmup, gathered, wire_if)
        summary["model_sync"] = sync
        summary["wall_split_s"] = wall_split()
        summary.update(learning.summary(args.data, [g["train_step_s"] for g in gathered]))
        atomic_write(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=2) + "\n")
    p50 = percentile(local["iter_time_s"], 0.5)
    print(
        f"train: rank {rank}/{world} done: {args.model} {args.compressor} {len(records)} iters, "
        f"iter_time_s p50 {p50:.4f}, {args.batch_size / p50:.1f} samples/s/rank, "
        f"payload {local['payload_bytes']:.0f} B/iter, warmup {warmup}",
        file=sys.stderr,
    )
    return 0


WALL: dict[str, float] = {"started": time.time()}  # this rank's life as time.time() marks (wall_split)
WALL_SYNC_ENV = "TESTBED_DDP_INIT_SYNC"  # "broadcast": DDP's own broadcast even when the checksums agree (A/B check)


def model_sync_mode(module, device) -> str:
    """Say "checksum" when every rank built bit-identical parameters and buffers (a sha256 of their bytes, compared
    through one all-gather of 8 bytes per rank): DDP's broadcast of the model from rank 0 (which crosses the shaped
    link: resnet18's 46.8 MB take about 37 s at 10 Mbit/s) would copy what every rank has, so it is skipped
    (DistributedDataParallel(init_sync=False)); "broadcast" otherwise, or when $TESTBED_DDP_INIT_SYNC says so."""
    import hashlib

    import torch
    import torch.distributed as dist

    h = hashlib.sha256()
    for t in [*module.parameters(), *module.buffers()]:
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-d too
    mine = torch.tensor([int.from_bytes(h.digest()[:8], "little", signed=True)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    same = all(bool((e == mine).all()) for e in every)
    return "checksum" if same and os.environ.get(WALL_SYNC_ENV) != "broadcast" else "broadcast"


def wall_split() -> dict[str, float]:
    """Rank 0's life in seconds: start (this module loaded, tens of ms after the interpreter, to every rank ready
    with its model built: torch, the rendezvous, the slowest peer's start), model sync (DDP's construction: the
    broadcast, or the checksum), warm-up, the measured steps. Columns wall_rank_start_s, wall_model_sync_s,
    wall_warmup_s, wall_measured_s (docs/results-format.md)."""
    return {
        "wall_rank_start_s": WALL["model_built"] - WALL["started"],
        "wall_model_sync_s": WALL["model_synced"] - WALL["model_built"],
        "wall_warmup_s": WALL["warm"] - WALL["model_synced"],
        "wall_measured_s": WALL["loop_done"] - WALL["warm"],
    }


def _mean(values):
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def step_phases(clock, stats, serial, t0, t1, t2, t_red, t3, last_grad) -> dict:
    sec = clock.seconds
    forward = sec(t0, t1)
    optimizer = sec(t_red, t3)
    if serial:
        return _pack(forward, sec(t1, t2), *_serial_reduce_phases(clock, stats, t2, t_red), optimizer)
    bwd_wall = sec(t1, t2)
    # tail: from the later of (last gradient, last hook return) to the end of backward
    tail_start = 0.0
    if last_grad is not None:
        tail_start = sec(t1, last_grad)
    if stats.hook_end is not None:
        tail_start = max(tail_start, sec(t1, stats.hook_end))
    tail_start = min(max(tail_start, 0.0), bwd_wall)
    tail = bwd_wall - tail_start
    encode = comm_in = decode_in = 0.0
    encode_tail = decode_tail = 0.0
    for phase, _index, a, b, critical in stats.intervals_with_kind():
        dt = sec(a, b)
        if critical:
            if phase == "encode":
                encode += dt
            elif phase == "comm":
                comm_in += dt
            else:
                decode_in += dt
        elif sec(t1, a) >= tail_start:  # callback / comm-worker work during the tail: exposed
            if phase == "encode":  # powersgd's work between its rounds, on the worker
                encode_tail += min(dt, tail)
            elif phase == "decode":
                decode_tail += min(dt, tail)
            # a worker's comm waits during the tail are the tail itself
    encode_tail = min(encode_tail, tail)
    decode_tail = min(decode_tail, tail - encode_tail)
    comm = comm_in + tail - encode_tail - decode_tail
    backward = max(0.0, bwd_wall - encode - comm_in - decode_in - tail)
    encode += encode_tail
    decode = decode_in + decode_tail
    return _pack(forward, backward, encode, comm, decode, optimizer)


def _serial_reduce_phases(clock, stats, t2, t_red) -> tuple[float, float, float]:
    """(encode, comm, decode) of the serial reduction window [t2, t_red]: encode is the hooks' work on this thread;
    decode the part of the decode intervals (a future callback may decode one bucket on the communication thread
    while this thread encodes the next) outside encode; comm what is left, the time this thread waited on the
    collectives with no codec work running. The three add up to the window."""
    sec = clock.seconds
    window = sec(t2, t_red)

    def spans(phase):
        return [(max(0.0, sec(t2, a)), min(window, sec(t2, b))) for ph, _i, a, b, _c in stats.intervals_with_kind()
                if ph == phase]  # fmt: skip

    enc = union(spans("encode"))
    dec_and_enc = union(spans("encode") + spans("decode"))
    encode = _length(enc)
    decode = _length(dec_and_enc) - encode
    return encode, max(0.0, window - encode - decode), decode


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _pack(forward, backward, encode, comm, decode, optimizer) -> dict:
    return dict(zip(PHASES, (forward, backward, encode, comm, decode, optimizer), strict=True))


def _summary(job: Job, device, warmup: int, gathered: list, wire_if: str | None) -> dict:
    from runners.timing import settle_ratio, slowest_rank_steps

    args, state, world = job.args, job.state, job.env.world_size
    step_times = slowest_rank_steps([g["iter_time_s"] for g in gathered])  # the job's step: the slowest rank's
    n_iters = len(step_times)
    mean_it = statistics.fmean(step_times)
    config = dataclasses.asdict(args)
    config["compressor_options"] = state.options()
    config["opt"] = job.options
    config["local_world_size"] = job.env.local_world_size
    return {
        "config": config,
        "env": {
            **device_facts(device),
            "python_version": platform.python_version(),
            "backend": job.backend,
            "world_size": world,
            "local_world_size": job.env.local_world_size,
            "hostname": socket.gethostname(),
            "wire_iface": wire_if,
        },
        "iter_time_s_mean": mean_it,
        "iter_time_s_p5": percentile(step_times, 0.05),
        "iter_time_s_p50": percentile(step_times, 0.5),
        "iter_time_s_p95": percentile(step_times, 0.95),
        "settle_ratio": settle_ratio(step_times),  # first two measured steps over the last two: ~1 when steady
        "samples_per_s": world * args.batch_size / mean_it,
        **{k: _mean([g[k] for g in gathered]) for k in PHASES + OVERLAP},
        "payload_bytes_per_iter": _mean([g["payload_bytes"] for g in gathered]),
        "wire_tx_bytes_per_iter": _mean([g["wire_tx_bytes"] for g in gathered]),
        "wire_rx_bytes_per_iter": _mean([g["wire_rx_bytes"] for g in gathered]),
        "peer_wait_s": _mean([g["peer_wait_s"] for g in gathered]),  # null without --skew-probe
        "warmup_iters_used": warmup,
        "measured_iters": n_iters,
    }


def device_facts(device) -> dict[str, Any]:
    """torch, CUDA, NCCL and driver versions and the device name, for the results row."""
    import torch

    facts: dict[str, Any] = {"torch_version": torch.__version__, "device": device.type}
    if device.type != "cuda":
        facts["device_name"] = platform.processor() or platform.machine()
        return facts
    facts["device_name"] = torch.cuda.get_device_name(device)
    facts["cuda_version"] = torch.version.cuda
    try:
        facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        facts["nccl_version"] = None
    facts["driver_version"] = _driver_version()
    return facts


def _driver_version() -> str | None:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def main(argv=None) -> int:
    try:
        job = validate(sys.argv[1:] if argv is None else argv)
    except (InputError, ValueError) as e:
        print(f"train: error: {e}", file=sys.stderr)
        return 2
    return run(job)


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: once rank 0 (the TCPStore server) has exited, a peer's store
    # client thread can abort the process at interpreter teardown ("terminate called without an active exception",
    # exit -6) although every record was written and the group destroyed in order. Seen on 2 ranks in `make test`.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
