"""Compressor registry, option validation, bit packing, layouts and checkpointing (no process group)."""

from __future__ import annotations

import pytest
import torch

from runners import compressors
from runners.compressors.base import FlatBucket, layout_of, orthogonalize_
from runners.compressors.powersgd import should_compress
from runners.compressors.signsgd import pack_signs, unpack_signs


def test_names_and_get_return_state_and_callable_hook():
    assert compressors.names() == ["syncsgd", "fp16", "bf16", "powersgd", "acpsgd", "signsgd", "topk", "mstopk"]
    for name in compressors.names():
        state, hook = compressors.get(name)
        assert callable(hook) and state.NAME == name
        assert state.COLLECTIVE in ("allreduce", "allgather") and state.ROUNDS >= 1
        assert isinstance(state.warmup_iters, int)
        # hyper-parameters come first in __slots__
        slots = type(state).__slots__
        assert tuple(slots[: len(state.HYPERPARAMS)]) == state.HYPERPARAMS


@pytest.mark.parametrize(
    "name,opts,needle",
    [
        ("nope", {}, "unknown compressor 'nope'; valid: syncsgd, fp16"),
        ("topk", {"ratio": 1.5}, "topk ratio 1.5 is outside (0, 1]"),
        ("topk", {"ratio": 0}, "topk ratio 0 is outside (0, 1]"),
        ("mstopk", {"ratio": -0.1}, "mstopk ratio -0.1 is outside (0, 1]"),
        ("topk", {"rank": 4}, "option 'rank' does not apply to topk; topk accepts: ratio, error_feedback"),
        ("fp16", {"ratio": 0.1}, "option 'ratio' does not apply to fp16; fp16 accepts: no options"),
        ("powersgd", {"rank": 0}, "powersgd rank 0 is not accepted: expected an integer >= 1"),
        ("powersgd", {"rank": 2.5}, "powersgd rank 2.5"),
        ("powersgd", {"start_iter": 1}, "powersgd start_iter 1 must be >= 2"),
        ("acpsgd", {"start_iter": 0}, "acpsgd start_iter 0 must be >= 2"),
        ("powersgd", {"min_compression_rate": -1}, "min_compression_rate -1"),
        ("signsgd", {"error_feedback": "yes"}, "signsgd error_feedback 'yes'"),
        ("mstopk", {"samplings": 0}, "mstopk samplings 0"),
    ],
)
def test_bad_options_raise_one_line_value_error(name, opts, needle):
    with pytest.raises(ValueError) as info:
        compressors.get(name, **opts)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_powersgd_start_iter_can_be_small_without_memory():
    state, _ = compressors.get("powersgd", start_iter=0, error_feedback=False, warm_start=False)
    assert state.warmup_iters == 0
    assert compressors.get("powersgd", start_iter=5)[0].warmup_iters == 5
    assert compressors.get("topk")[0].warmup_iters == 2  # per-bucket residual: wait for DDP's rebuild
    assert compressors.get("signsgd")[0].warmup_iters == 0


@pytest.mark.parametrize("d", [1, 7, 8, 9, 64, 1001])
def test_sign_packing_round_trips(d):
    bits = torch.rand(d, generator=torch.Generator().manual_seed(d)) > 0.5
    packed = pack_signs(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == (d + 7) // 8
    assert torch.equal(unpack_signs(packed, d), bits)
    two = torch.stack([packed, pack_signs(~bits)])
    assert torch.equal(unpack_signs(two, d), torch.stack([bits, ~bits]))


def test_sign_packing_is_msb_first():
    bits = torch.tensor([True] + [False] * 7 + [False] * 7 + [True])
    assert pack_signs(bits).tolist() == [128, 1]


def test_should_compress_follows_pytorch_rule():
    # (rows + cols) * rank * rate < rows * cols
    assert should_compress(100, 100, 4, 2.0)  # 1600 < 10000
    assert not should_compress(8, 8, 4, 2.0)  # 128 >= 64
    assert should_compress(8, 8, 4, 0.0)


def test_layout_and_flat_bucket_views():
    buf = torch.arange(2 * 3 + 4 + 2 * 2 * 2, dtype=torch.float32)
    fb = FlatBucket(3, buf, [(2, 3), (4,), (2, 2, 2)], True)
    lay = layout_of(fb)
    assert lay.offsets == (0, 6, 10) and lay.numel == 18
    mats, vecs = lay.split()
    assert mats == [(0, 2, 3), (10, 2, 4)] and vecs == [(6, 4)]
    g = fb.gradients()
    g[1].fill_(-1)
    assert buf[6:10].eq(-1).all()  # views, not copies


def test_orthogonalize_gives_orthonormal_columns():
    for r in (1, 2, 4):
        m = torch.randn(20, r, generator=torch.Generator().manual_seed(r))
        orthogonalize_(m)
        assert torch.allclose(m.t() @ m, torch.eye(r), atol=1e-5)


def test_state_dict_round_trip_and_mismatch():
    state, _ = compressors.get("acpsgd", rank=2)
    state.iter, state.step = 7, 5
    state.error[0] = torch.ones(3)
    state.p_memory[0] = torch.arange(4.0)
    sd = state.state_dict()
    fresh, _ = compressors.get("acpsgd", rank=2)
    fresh.load_state_dict(sd)
    assert fresh.iter == 7 and fresh.step == 5
    assert torch.equal(fresh.error[0], torch.ones(3)) and torch.equal(fresh.p_memory[0], torch.arange(4.0))
    sd["error"][0].fill_(9)  # the loaded state does not alias the dict
    assert torch.equal(fresh.error[0], torch.ones(3))
    with pytest.raises(ValueError, match="options"):
        compressors.get("acpsgd", rank=3)[0].load_state_dict(sd)
    with pytest.raises(ValueError, match="not 'topk'"):
        compressors.get("topk")[0].load_state_dict(sd)


@pytest.mark.parametrize("d,ratio", [(1000, 0.01), (100_000, 0.01), (300_000, 0.001), (50_000, 0.3), (7, 0.5)])
def test_mstopk_sends_exactly_k_real_values_from_above_the_band(d, ratio):
    from runners.compressors.mstopk import MSTopKState

    state = MSTopKState(ratio=ratio)
    v = torch.randn(d, generator=torch.Generator().manual_seed(d)) * torch.linspace(0.1, 3, d)
    k = state.k_for(d)
    idx, count = state.select(v, k)
    assert count == k and idx.numel() == k
    assert idx.unique().numel() == k  # k distinct entries: no padding
    a = v.abs()
    thres1, thres2 = state.thresholds(a, k)
    sent = torch.zeros(d, dtype=torch.bool)
    sent[idx] = True
    if int((a >= thres1).sum()) <= k and int((a >= thres2).sum()) >= k:
        assert bool(sent[a >= thres1].all())  # every entry above the upper threshold is sent
        assert float(a[sent].min()) >= float(thres2)  # the rest comes from the band
    # close to the exact top-k: the sent magnitudes are at least as large as the (1.5 k)-th largest
    assert float(a[sent].min()) >= float(torch.topk(a, min(d, int(1.5 * k) + 1)).values[-1])


def test_mstopk_with_ties_still_sends_k_distinct_entries():
    from runners.compressors.mstopk import MSTopKState

    state = MSTopKState(ratio=0.05)
    v = torch.zeros(20_000)
    v[:37] = torch.arange(1, 38, dtype=torch.float32)
    idx, count = state.select(v, state.k_for(v.numel()))
    assert count == 1000 and idx.unique().numel() == 1000
    assert set(range(37)) <= set(idx.tolist())


def test_mstopk_bisection_brackets_the_target():
    from runners.compressors.mstopk import bisect

    s = torch.rand(10_000, generator=torch.Generator().manual_seed(3))
    t_le, t_gt = bisect(s, 100, 20)
    assert int((s >= t_le).sum()) <= 100 < int((s >= t_gt).sum())
    assert float(t_le - t_gt) < 1e-4


# ------------------------------------------------------------------------------------------------ CUDA streams
def _bare_worker():
    """A CommWorker without its thread and group: submit() and run_job() called directly (the logic under test)."""
    import queue

    from runners.compressors.base import CommWorker

    w = CommWorker.__new__(CommWorker)
    w._jobs, w._streams, w.group, w.device = queue.SimpleQueue(), {}, None, None
    return w


def test_comm_worker_on_cpu_touches_no_cuda(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("torch.cuda touched for a CPU job")

    for name in ("current_stream", "Event", "Stream", "set_device", "stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, boom)
    w = _bare_worker()
    fut = w.submit(lambda: torch.ones(2), torch.device("cpu"))
    w.run_job(*w._jobs.get())
    assert torch.equal(fut.wait(), torch.ones(2))


def test_comm_worker_runs_a_cuda_job_on_its_own_stream_after_the_hooks_event(monkeypatch):
    """GPUs cannot exist here: streams, events and the CUDA-aware future are stand-ins that log what the worker does
    with them, in order. What must hold: the event is recorded on the hook's stream at submit; the job runs with the
    worker's stream current, after that stream waited on the event; every crossing tensor is recorded on the worker's
    stream before the job; the future completes on the worker's stream (so DDP waits on it, not the other way)."""
    import contextlib

    log: list[tuple] = []
    current = {"s": None}

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, ev):
            log.append(("wait", self.name, ev.on))

    class Event:
        def record(self, stream):
            self.on = stream.name
            log.append(("record", stream.name))

    class Future:
        def __init__(self, devices=None):
            self.devices = devices

        def set_result(self, value):
            log.append(("complete", current["s"].name))

        def set_exception(self, e):
            raise e

    class Crossing:
        def record_stream(self, stream):
            log.append(("record_stream", stream.name))

    @contextlib.contextmanager
    def stream_ctx(s):
        old, current["s"] = current["s"], s
        try:
            yield
        finally:
            current["s"] = old

    current["s"] = Stream("hook")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["s"])
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("worker"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: log.append(("set_device", str(d))))
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(torch.futures, "Future", Future)
    w = _bare_worker()
    dev = torch.device("cuda", 0)
    fut = w.submit(lambda: log.append(("job", current["s"].name)), dev, crossing=(Crossing(), Crossing()))
    assert fut.devices == [dev] and log == [("record", "hook")]  # at submit, on the hook's stream
    w.run_job(*w._jobs.get())
    assert log == [("record", "hook"), ("set_device", "cuda:0"), ("wait", "worker", "hook"),
                   ("record_stream", "worker"), ("record_stream", "worker"), ("job", "worker"),
                   ("complete", "worker")]  # fmt: skip
    assert current["s"].name == "hook"  # the worker's stream was current only for the job
