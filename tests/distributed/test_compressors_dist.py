"""Compressor hooks on 2 and 3 real gloo ranks (spawned processes on 127.0.0.1), through DDP and directly.

Two launches for the whole module (each rank's start, torch's import, is most of the cost): every 2-rank check runs in
one job (`two_rank`), every 3-rank check in another (`three_rank`), each a module fixture read by many tests.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world
from torch.testing import assert_close

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("test_compressors_dist")]  # module-scoped jobs

TINY_CAP_MB = 0.0001  # ~100 bytes: every parameter gets its own DDP bucket


# ------------------------------------------------------------------------------------------------ rank workers


def _square_mlp():
    import torch.nn as nn

    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _square_batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def _grads_after(name, opts, rank, model_kind, cap_mb, capture_step=None, steps=1):
    """Run ``steps`` backward passes (no optimizer step, grads zeroed between) under DDP + compressor; return the
    last step's gradients, the bucket count, and what the hook saw at ``capture_step`` (input, old error, new
    error, output per bucket)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors
    from runners.buckets import BucketRecorder
    from runners.models import build

    if model_kind == "square":
        module = _square_mlp()
        x, y = _square_batch(rank)

        def loss_fn(out, target):
            return ((out - target) ** 2).mean()
    else:
        spec = build("mlp", 8, seed=0, rank=rank)
        module, loss_fn = spec.module, spec.loss_fn
        x, y = spec.make_batch(0)
    ddp = DDP(module, bucket_cap_mb=cap_mb, gradient_as_bucket_view=True)
    state, hook = compressors.get(name, **opts)
    recorder = BucketRecorder(None)
    seen = {}
    step = [0]

    def capturing(st, bucket):
        if step[0] != capture_step:
            return hook(st, bucket)
        idx = bucket.index()
        err = getattr(st, "error", {}).get(idx)
        before = (bucket.buffer().clone(), None if err is None else err.clone())
        fut = hook(st, bucket)
        out = fut.wait().clone()
        new_err = getattr(st, "error", {}).get(idx)
        seen[idx] = (*before, None if new_err is None else new_err.clone(), out)
        return fut

    if getattr(state, "builtin", False):
        compressors.attach(ddp, state, hook)
    else:
        ddp.register_comm_hook(state, recorder.wrap(capturing))
    for s in range(steps):
        step[0] = s
        ddp.zero_grad(set_to_none=False)
        loss_fn(ddp(x), y).backward()
    grads = [p.grad.detach().clone() for p in ddp.module.parameters()]
    return {"grads": grads, "buckets": len(recorder.buckets), "seen": seen, "payload": state.stats.payload_bytes}


def _reference_grads(model_kind, world):
    """Single-process gradients on the concatenated batch of all ranks."""
    from runners.models import build

    if model_kind == "square":
        module = _square_mlp()
        xs, ys = zip(*[_square_batch(r) for r in range(world)], strict=True)
        ((module(torch.cat(xs)) - torch.cat(ys)) ** 2).mean().backward()
    else:
        spec = build("mlp", 8, seed=0, rank=0)
        batches = [build("mlp", 8, seed=0, rank=r).make_batch(0) for r in range(world)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        module = spec.module
        spec.loss_fn(module(x), y).backward()
    return [p.grad.detach().clone() for p in module.parameters()]


def _equivalence_worker(rank, world):
    out = {"ref_mlp": _reference_grads("mlp", world), "ref_square": _reference_grads("square", world)}
    for key, name, opts in (
        ("sync_builtin", "syncsgd", {}),
        ("sync_hook", "syncsgd", {"builtin": False}),
        ("fp16", "fp16", {}),
        ("bf16", "bf16", {}),
    ):
        out[key] = _grads_after(name, opts, rank, "mlp", 25)
    # compressed from step 2 (start_iter 2), rank >= every matrix dimension, always compress
    exact = {"rank": 16, "min_compression_rate": 0.0}
    out["powersgd_exact"] = _grads_after("powersgd", exact, rank, "square", TINY_CAP_MB, steps=3)
    out["acpsgd_exact_p"] = _grads_after("acpsgd", exact, rank, "square", TINY_CAP_MB, steps=3)
    out["acpsgd_exact_q"] = _grads_after("acpsgd", exact, rank, "square", TINY_CAP_MB, steps=4)
    out["powersgd_mlp_exact"] = _grads_after("powersgd", {"rank": 64, "min_compression_rate": 0.0}, rank, "mlp",
                                             TINY_CAP_MB, steps=3)  # fmt: skip
    out["topk_full"] = _grads_after("topk", {"ratio": 1.0}, rank, "mlp", TINY_CAP_MB, steps=3)
    out["mstopk_full"] = _grads_after("mstopk", {"ratio": 1.0}, rank, "mlp", TINY_CAP_MB, steps=3)
    # small rank / ratio: capture what each hook saw at the 1st and 2nd compressed steps
    for name, opts in (
        ("powersgd", {"rank": 1, "min_compression_rate": 0.0}),
        ("acpsgd", {"rank": 1, "min_compression_rate": 0.0}),
        ("topk", {"ratio": 0.05}),
        ("mstopk", {"ratio": 0.05}),
    ):
        for cap in (2, 3):
            out[f"{name}_small_{cap}"] = _grads_after(name, opts, rank, "mlp", TINY_CAP_MB, capture_step=cap,
                                                      steps=cap + 1)  # fmt: skip
    return out


def _two_rank_worker(rank, world):
    """Every 2-rank check in one job: the equivalences, the learning runs, then (last: it disables torch.cuda's stream
    calls in this process) the overlapping hooks on CPU."""
    out = _equivalence_worker(rank, world)
    out["trained"] = _train_worker(rank, world, TRAIN_CONFIGS, TRAIN_STEPS)
    out["cpu_no_cuda"] = _cpu_touches_no_cuda_worker(rank, world)
    return out


def _three_rank_worker(rank, world):
    """signSGD majority vote on a hand-made bucket, multi-bucket training consistency, and the half-precision casts
    (from tests/distributed/test_overlap_stress.py) with 3 ranks."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors
    from runners.compressors import FlatBucket
    from runners.models import build

    out = {}
    shapes = [(7, 5), (5,), (3, 2, 2, 2), (9,)]
    d = sum(torch.Size(s).numel() for s in shapes)
    g = torch.randn(d, generator=torch.Generator().manual_seed(rank))
    g[3] = 0.0  # sign(0) counts as +1
    for ef in (False, True):
        state, hook = compressors.get("signsgd", error_feedback=ef)
        state.iter = state.warmup_iters
        fb = FlatBucket(0, g.clone(), shapes, True)
        res = hook(state, fb).wait().clone()
        out[f"sign_ef{ef}"] = (g, res, state.error.get(0))
    # consistency: after training steps, every rank holds the same parameters
    for name, opts in (("powersgd", {"rank": 2}), ("acpsgd", {"rank": 2}), ("topk", {"ratio": 0.1}),
                       ("mstopk", {"ratio": 0.1}), ("signsgd", {"error_feedback": True}), ("fp16", {})):  # fmt: skip
        spec = build("cnn", 4, seed=0, rank=rank, image_size=8)
        ddp = DDP(spec.module, bucket_cap_mb=TINY_CAP_MB, gradient_as_bucket_view=True)
        state, hook = compressors.get(name, **opts)
        compressors.attach(ddp, state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for s in range(5):
            x, y = spec.make_batch(s)
            spec.loss_fn(ddp(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        out[f"params_{name}"] = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    out["cast"] = _cast_worker(rank, world)
    return out


def _cast_worker(rank, world):
    from runners import compressors
    from runners.compressors import FlatBucket

    g = torch.randn(1000, generator=torch.Generator().manual_seed(rank)) * 100
    g[0] = 70000.0  # above fp16's max: cast first overflows (as torch's fp16_compress_hook); divide first would not
    out = {"g": g}
    for overlap in (False, True):
        for name in ("fp16", "bf16"):
            state, hook = compressors.get(name, overlap=overlap)
            out[(name, overlap)] = hook(state, FlatBucket(0, g.clone(), [(1000,)], True)).wait().clone()
    return out


def _train_worker(rank, world, configs, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from runners import compressors
    from runners.models import build

    out = {}
    for key, name, opts in configs:
        spec = build("mlp", 32, seed=1, rank=rank, distinct_batches=4)
        ddp = DDP(spec.module, bucket_cap_mb=0.01, gradient_as_bucket_view=True)
        state, hook = compressors.get(name, **opts)
        compressors.attach(ddp, state, hook)
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
        losses = []
        for s in range(steps):
            x, y = spec.make_batch(s)
            loss = spec.loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(loss.item())
        out[key] = losses
    return out


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def two_rank():
    # about 25 s of work on a quiet machine (the 9 learning runs most of it): a generous deadline for a loaded one
    return run_world(_two_rank_worker, 2, timeout_s=200)


def test_syncsgd_equals_single_process_on_concatenated_batch(two_rank):
    for r in range(2):
        for key in ("sync_builtin", "sync_hook"):
            for got, want in zip(two_rank[r][key]["grads"], two_rank[r]["ref_mlp"], strict=True):
                assert_close(got, want, rtol=1e-5, atol=1e-6)
    # payload accounting of the builtin baseline: the dense fp32 gradient bytes
    assert two_rank[0]["sync_hook"]["payload"] == 4 * sum(g.numel() for g in two_rank[0]["ref_mlp"])


@pytest.mark.parametrize("key,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_half_precision_all_reduce_close_to_exact(two_rank, key, tol):
    for got, want in zip(two_rank[0][key]["grads"], two_rank[0]["ref_mlp"], strict=True):
        assert_close(got, want, rtol=tol, atol=tol)
    assert two_rank[0][key]["payload"] == 2 * sum(g.numel() for g in two_rank[0]["ref_mlp"])


@pytest.mark.parametrize("key", ["powersgd_exact", "acpsgd_exact_p", "acpsgd_exact_q"])
def test_lowrank_with_full_rank_reproduces_exact_average(two_rank, key):
    res = two_rank[0][key]
    assert res["buckets"] >= 5
    for got, want in zip(res["grads"], two_rank[0]["ref_square"], strict=True):
        assert_close(got, want, rtol=1e-4, atol=1e-5)
    # compressed: payload is the factors, not the dense bytes (16x16 matrices, rank 16 -> P alone is as big;
    # powersgd sends P and Q)
    assert res["payload"] > 0


def test_powersgd_full_rank_on_rectangular_matrices_is_exact(two_rank):
    res = two_rank[0]["powersgd_mlp_exact"]
    assert res["buckets"] >= 5
    for got, want in zip(res["grads"], two_rank[0]["ref_mlp"], strict=True):
        assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key", ["topk_full", "mstopk_full"])
def test_sparse_with_ratio_one_equals_all_reduce(two_rank, key):
    for got, want in zip(two_rank[0][key]["grads"], two_rank[0]["ref_mlp"], strict=True):
        assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["powersgd", "acpsgd", "topk", "mstopk"])
@pytest.mark.parametrize("step", [2, 3])
def test_error_feedback_residual_is_what_was_not_sent(two_rank, name, step):
    """For every bucket: mean over ranks of (input_i - new_error_i) == the returned average, i.e. each rank's
    residual is exactly its input minus what its message contributed; and the residual is not trivially 0."""
    key = f"{name}_small_{step}"
    seen = [two_rank[r][key]["seen"] for r in range(2)]
    assert two_rank[0][key]["buckets"] >= 5 and len(seen[0]) >= 5
    nonzero = 0.0
    for idx in seen[0]:
        sent = []
        for r in range(2):
            buf, old_err, new_err, out = seen[r][idx]
            v = buf + old_err if old_err is not None else buf
            sent.append(v - new_err)
            nonzero += float(new_err.abs().sum())
        assert_close((sent[0] + sent[1]) / 2, seen[0][idx][3], rtol=1e-4, atol=1e-6)
        assert_close(seen[0][idx][3], seen[1][idx][3])  # every rank got the same result
    assert nonzero > 0


def test_topk_residual_keeps_all_but_k_entries(two_rank):
    seen = two_rank[0]["topk_small_2"]["seen"]
    for buf, old_err, new_err, _ in seen.values():
        v = buf + old_err if old_err is not None else buf
        k = max(1, -(-v.numel() * 5 // 100))
        sent_mask = new_err != v
        assert int(sent_mask.sum()) <= k
        # what was sent are the k largest magnitudes
        if int(sent_mask.sum()):
            assert float(v[sent_mask].abs().min()) >= float(torch.cat([v[~sent_mask].abs(), torch.zeros(1)]).max()) - 1e-7


@pytest.fixture(scope="module")
def three_rank():
    return run_world(_three_rank_worker, 3, timeout_s=200)


@pytest.mark.parametrize("ef", [False, True])
def test_signsgd_is_majority_vote_of_signs(three_rank, ef):
    from runners.compressors.base import FlatBucket, layout_of

    gs = [three_rank[r][f"sign_ef{ef}"][0] for r in range(3)]
    res = three_rank[0][f"sign_ef{ef}"][1]
    signs = [torch.where(g >= 0, 1.0, -1.0) for g in gs]
    vote = torch.sign(sum(signs))
    assert torch.equal(torch.sign(res), vote)
    # magnitude: per tensor, the mean over ranks of mean |g|
    lay = layout_of(FlatBucket(0, gs[0], [(7, 5), (5,), (3, 2, 2, 2), (9,)], True))
    for off, n in zip(lay.offsets, lay.numels, strict=True):
        scale = sum(float(g[off : off + n].abs().mean()) for g in gs) / 3
        assert_close(res[off : off + n].abs(), torch.full((n,), scale), rtol=1e-5, atol=1e-7)
    for r in range(3):
        assert torch.equal(three_rank[r][f"sign_ef{ef}"][1], res)
    err = three_rank[0][f"sign_ef{ef}"][2]
    if ef:  # E = v - a * sign(v)
        g = gs[0]
        for off, n in zip(lay.offsets, lay.numels, strict=True):
            a = g[off : off + n].abs().mean()
            assert_close(err[off : off + n], g[off : off + n] - a * signs[0][off : off + n])
    else:
        assert err is None


@pytest.mark.parametrize("name", ["powersgd", "acpsgd", "topk", "mstopk", "signsgd", "fp16"])
def test_three_ranks_many_buckets_stay_consistent(three_rank, name):
    p0 = three_rank[0][f"params_{name}"]
    assert torch.isfinite(p0).all()
    for r in (1, 2):
        assert torch.equal(three_rank[r][f"params_{name}"], p0)


TRAIN_CONFIGS = [
    ("syncsgd", "syncsgd", {}),
    ("fp16", "fp16", {}),
    ("bf16", "bf16", {}),
    ("powersgd", "powersgd", {"rank": 2}),
    ("acpsgd", "acpsgd", {"rank": 4}),
    ("signsgd", "signsgd", {}),
    ("ef-signsgd", "signsgd", {"error_feedback": True}),
    ("topk", "topk", {"ratio": 0.05}),
    ("mstopk", "mstopk", {"ratio": 0.05}),
]
TRAIN_STEPS = 100
LOSS_THRESHOLD = 1.0  # from ln(10) = 2.3 at init; a hook that loses the gradient stays near 2.3


@pytest.mark.parametrize("key", [c[0] for c in TRAIN_CONFIGS])
def test_every_compressor_learns_the_synthetic_task(two_rank, key):
    losses = two_rank[0]["trained"][key]
    assert losses[0] > 2.0
    final = sum(losses[-4:]) / 4
    assert final < LOSS_THRESHOLD, f"{key}: loss {losses[0]:.3f} -> {final:.3f} after {TRAIN_STEPS} steps"


def _cpu_touches_no_cuda_worker(rank, world):
    """Every overlapping hook (the PowerSGD worker, the chained decodes) with torch.cuda's stream and event calls made
    to raise: on CPU tensors the CUDA stream handling must not run. Overlap off gives the reference (bitwise equal)."""

    def boom(name):
        def touched(*a, **k):
            raise AssertionError(f"torch.cuda.{name} called on CPU")

        return touched  # one function per name (torch._dynamo refuses one object under two torch names)

    for name in ("current_stream", "Event", "Stream", "set_device", "stream", "synchronize"):
        setattr(torch.cuda, name, boom(name))
    out = {}
    for name, opts in (("powersgd", {"rank": 2, "min_compression_rate": 0.0}), ("fp16", {}), ("topk", {"ratio": 0.1}),
                       ("signsgd", {})):  # fmt: skip
        on = _grads_after(name, {**opts, "overlap": True}, rank, "mlp", TINY_CAP_MB, steps=3)["grads"]
        off = _grads_after(name, {**opts, "overlap": False}, rank, "mlp", TINY_CAP_MB, steps=3)["grads"]
        out[name] = all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    return out


def test_overlapping_hooks_on_cpu_touch_no_cuda_and_equal_the_blocking_mode(two_rank):
    for rank_result in two_rank:
        assert rank_result["cpu_no_cuda"] == {"powersgd": True, "fp16": True, "topk": True, "signsgd": True}


def test_half_precision_casts_first_then_divides_in_16_bits(three_rank):
    """fp16: an entry above 65504 overflows when cast first (torch's fp16_compress_hook) and stays finite when
    divided first; the rest is the 16-bit average, the same with overlap on and off."""
    res = [three_rank[r]["cast"] for r in range(3)]
    for name, dtype, tol in (("fp16", torch.float16, 2e-3), ("bf16", torch.bfloat16, 2e-2)):
        want = sum(res[r]["g"].to(dtype).div_(3).float() for r in range(3))
        for r in range(3):
            on, off = res[r][(name, True)], res[r][(name, False)]
            assert torch.equal(on, off) and torch.equal(on, res[0][(name, True)])
            assert_close(on[1:], want[1:], rtol=tol, atol=100 * tol)  # |g| ~ 100: 16-bit sums round
    assert torch.isinf(res[0][("fp16", True)][0])  # divide first would give 70000 / 3 * 3, finite
    assert torch.isfinite(res[0][("bf16", True)][0])
