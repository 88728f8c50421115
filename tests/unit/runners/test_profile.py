"""runners.profile: the testbed.profile/1 format on a small model (single process, world-size-1 gloo group)."""

from __future__ import annotations

import json

import pytest

from runners.profile import profile_model, robust_sd


def test_profile_format_and_values():
    p = profile_model("cnn", 4, ["syncsgd", "powersgd", "topk"], image_size=8, iters=3, bucket_cap_mb=0.001,
                      options={"powersgd": {"rank": 1}})  # fmt: skip
    json.dumps(p)  # serialisable
    assert set(p) == {"schema", "model", "batch_size", "image_size", "seq_len", "device", "torch_version",
                      "hostname", "bucket_cap_mb", "forward_s", "backward_s", "optimizer_s", "compute_jitter_s",
                      "buckets", "compressors"}  # fmt: skip
    # a spread of 3 steps: >= 0 and finite; its size against the step is noise on a loaded machine (robust_sd below)
    assert 0 <= p["compute_jitter_s"] < float("inf")
    assert p["forward_s"] > 0 and p["backward_s"] > 0 and p["optimizer_s"] > 0
    assert p["schema"] == "testbed.profile/1" and p["image_size"] == 8 and p["seq_len"] is None
    assert len(p["buckets"]) >= 2 and all(b["grad_bytes"] == 4 * b["numel"] for b in p["buckets"])
    ready = [b["ready_at_s"] for b in p["buckets"]]
    assert ready == sorted(ready) and ready[0] >= 0
    total = sum(b["grad_bytes"] for b in p["buckets"])
    assert total == 4 * (16 * 3 * 9 + 16 + 32 * 16 * 9 + 32 + 10 * 32 + 10)
    sync = p["compressors"]["syncsgd"]
    assert sync["collective"] == "allreduce" and sync["rounds"] == 1
    assert sum(b["payload_bytes"] for b in sync["buckets"]) == total
    ps = p["compressors"]["powersgd"]
    assert ps["options"]["rank"] == 1 and ps["rounds"] == 2
    assert 0 < sum(b["payload_bytes"] for b in ps["buckets"]) < total
    assert all(b["encode_s"] > 0 and b["decode_s"] > 0 for b in ps["buckets"])
    assert p["compressors"]["topk"]["collective"] == "allgather"


def test_robust_sd_ignores_a_rare_outlier():
    xs = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9, 1.0, 5.0]  # one stalled iteration among typical ones
    assert robust_sd(xs) == pytest.approx(1.4826 * 0.1)
    assert robust_sd([1.0, 2.0]) == 0.0  # too few samples to tell spread from noise


def test_profile_rejects_bad_options():
    with pytest.raises(ValueError, match="does not apply to topk"):
        profile_model("mlp", 4, ["topk"], options={"topk": {"rank": 2}})


def test_profile_command_line_writes_the_profile_and_refuses_bad_options(tmp_path, capsys):
    import json

    from runners import profile

    out = tmp_path / "p.json"
    assert profile.main(["--model", "mlp", "--batch-size", "4", "--compressors", "syncsgd,powersgd", "--iters", "1",
                         "--opt", "powersgd.rank=2", "--out", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["model"] == "mlp" and set(data["compressors"]) >= {"syncsgd", "powersgd"}
    assert profile.main(["--model", "mlp", "--batch-size", "4", "--opt", "rank=2", "--out", str(tmp_path / "q")]) == 2
    assert "is not NAME.KEY=VALUE" in capsys.readouterr().err


def test_local_collectives_are_the_identity_of_one_rank_and_issue_nothing(tmp_path, monkeypatch):
    """What the CUDA profile runs its codecs under (GPUs cannot exist here: the same on CPU tensors): every hook gives
    the result it gives over a real one-rank gloo group, and torch.distributed's own collectives are never called."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from runners import compressors
    from runners.compressors import FlatBucket
    from runners.profile import local_collectives

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        shapes = [(16, 8), (8,), (4, 4)]
        g = torch.randn(16 * 8 + 8 + 16, generator=torch.Generator().manual_seed(3))

        def reduce_once(name, opts):
            state, hook = compressors.get(name, **opts)
            state.iter = state.warmup_iters
            try:
                return hook(state, FlatBucket(0, g.clone(), shapes, True)).wait().clone(), state.stats.payload_bytes
            finally:
                state.close()

        cases = [("powersgd", {"rank": 2, "min_compression_rate": 0.0}), ("topk", {"ratio": 0.25}), ("fp16", {}),
                 ("signsgd", {}), ("syncsgd", {"builtin": False})]  # fmt: skip
        want = [reduce_once(n, o) for n, o in cases]
        issued = []
        for name in ("all_reduce", "all_gather_into_tensor"):
            real = getattr(dist, name)
            monkeypatch.setattr(dist, name, lambda *a, _real=real, _n=name, **k: issued.append(_n) or _real(*a, **k))
        with local_collectives():
            got = [reduce_once(n, o) for n, o in cases]
        assert issued == []
        for (name, _), (gt, gb), (wt, wb) in zip(cases, got, want, strict=True):
            assert torch.equal(gt, wt) and gb == wb, name
        reduce_once("syncsgd", {"builtin": False})
        assert issued == ["all_reduce"]  # restored on the way out
    finally:
        dist.destroy_process_group()
