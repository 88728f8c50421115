"""Ordering stress on real gloo ranks: overlapped hooks (un-waited futures, powersgd's ordered worker) under
per-rank random sleeps in backward and before every collective, TORCH_DISTRIBUTED_DEBUG=DETAIL (collective
fingerprints checked across ranks), >= 20 DDP buckets. Every compressor must finish, and its replicas must be bitwise
equal to the blocking implementation's (overlap off) after the same steps. PyTorch's own powerSGD_hook, which issues
its second and third all-reduce from future callbacks, must fail or hang under the same stress (bounded), which shows
the stress does reorder collectives.

4 ranks, the world the control breaks in. 2 ranks under the same kind of stress (per-rank random delays in backward
and before each collective, >= 20 buckets, every built-in compressor, bitwise replicas) is
test_check_compressor.py::test_every_builtin_compressor_passes, and overlap on == off bitwise on 2 ranks is
test_compressors_dist.py::test_overlapping_hooks_on_cpu_touch_no_cuda_and_equal_the_blocking_mode (both in
tests/distributed).
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

pytestmark = pytest.mark.timeout(300)

DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
STEPS = 5  # 2 dense warm-up steps (start_iter 2) + 3 compressed
LAYERS = 21  # DDP packs each weight with its bias: 21 buckets with a tiny cap
CAP_MB = 0.0001
JITTER_S = 0.002

CASES = [
    ("fp16", {}),
    ("bf16", {}),
    ("acpsgd", {"rank": 2, "min_compression_rate": 0.0}),
    ("signsgd", {"error_feedback": True}),
    ("topk", {"ratio": 0.05}),
    ("mstopk", {"ratio": 0.05}),
    ("powersgd", {"rank": 2, "min_compression_rate": 0.0}),
    ("powersgd", {"rank": 2, "min_compression_rate": 0.0, "flavour": "pytorch"}),
]


def _install_jitter(rank: int, seed: int):
    """Per-rank seeded random sleeps before every all-reduce / all-gather (patched before runners is imported,
    which resolves its all-gather function at import). Returns a switch and the generator."""
    import random
    import time

    import torch.distributed as dist

    rng = random.Random(seed * 7919 + rank)
    on = [True]

    def sleepy(fn):
        def wrapped(*a, **k):
            if on[0]:
                time.sleep(rng.uniform(0.0, JITTER_S))
            return fn(*a, **k)

        return wrapped

    dist.all_reduce = sleepy(dist.all_reduce)
    dist.all_gather_into_tensor = sleepy(dist.all_gather_into_tensor)
    return on, rng


def _mlp(rank: int, rng):
    import time

    import torch.nn as nn

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(24, 24), nn.Tanh()]
    module = nn.Sequential(*layers[:-1])
    for p in module.parameters():  # sleeps in backward, per gradient
        p.register_hook(lambda g: (time.sleep(rng.uniform(0.0, JITTER_S)), g)[1])
    g = torch.Generator().manual_seed(100 + rank)
    return module, torch.randn(16, 24, generator=g), torch.randn(16, 24, generator=g)


def _train(module, x, y, state, hook, steps=STEPS):
    from torch.nn.parallel import DistributedDataParallel as DDP

    buckets = set()

    def counting(st, bucket):
        buckets.add(bucket.index())
        return hook(st, bucket)

    ddp = DDP(module, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=True)
    ddp.register_comm_hook(state, counting)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(steps):
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()]), len(buckets)


def _ours_worker(rank, world, cases):
    _, rng = _install_jitter(rank, 1)
    from runners import compressors

    out = {}
    for name, opts in cases:
        key = name + "-" + opts.get("flavour", "")
        for overlap in (False, True):
            module, x, y = _mlp(rank, rng)
            state, hook = compressors.get(name, overlap=overlap, **opts)
            params, nb = _train(module, x, y, state, hook)
            state.close()
            out[(key, overlap)] = (params, nb, state.worker is None)
    return out


def _torch_worker(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    _, rng = _install_jitter(rank, 1)
    module, x, y = _mlp(rank, rng)
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                             min_compression_rate=0.0)  # fmt: skip
    params, nb = _train(module, x, y, state, ps.powerSGD_hook, steps=8)
    return params, nb


def test_overlapped_hooks_survive_jitter_and_equal_blocking_bitwise():
    world = 4
    res = run_world(_ours_worker, world, CASES, env=DETAIL, timeout_s=240, collective_timeout_s=60)
    for name, opts in CASES:
        key = name + "-" + opts.get("flavour", "")
        blocking, nb, _ = res[0][(key, False)]
        assert nb >= 20, f"{key}: only {nb} buckets"
        assert torch.isfinite(blocking).all()
        for r in range(world):
            params, _, closed = res[r][(key, True)]
            assert torch.equal(params, blocking), f"{key}: rank {r} overlapped differs from blocking"
            assert torch.equal(res[r][(key, False)][0], blocking), f"{key}: rank {r} replica differs"
            assert closed


def test_pytorch_powersgd_hook_breaks_under_the_same_stress():
    """The control: a hook that issues collectives from callbacks fails (fingerprint mismatch, gloo enforce, the
    collective timeout) or hangs until the harness kills it (30 s after the 4 ranks joined the group, however long a
    loaded machine took to start them: so a deadline never passes before the hook ran)."""
    with pytest.raises((AssertionError, TimeoutError)) as info:
        run_world(_torch_worker, 4, env=DETAIL, timeout_s=30, collective_timeout_s=15)
    print(str(info.value)[-2000:])


# the half-precision casts (3 ranks): test_compressors_dist.py::test_half_precision_casts_first_then_divides_in_16_bits
