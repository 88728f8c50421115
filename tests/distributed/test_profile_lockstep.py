"""The co-located profile's codecs in place as a GPU profile measures them (runners.profile.lockstep with
`local_codecs`, the default on CUDA), run here on the CPU: 2 real processes, each training with the compressor inside
backward, its collectives the identity of one rank, every step started after a barrier of their gloo world group.
That the CUDA figures match a GPU trial's timeline is the GPU check's question (docs/benchmarks.md, "GPU check")."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch.multiprocessing as mp

pytestmark = pytest.mark.timeout(300)


def _rank(rank: int, world: int, store: str, out: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch

    from runners.profile import lockstep

    torch.set_num_threads(1)
    result = lockstep("mlp", 8, ["syncsgd", "powersgd", "topk"], rank=rank, world_size=world,
                      init_method=f"file://{store}", image_size=64, seq_len=32, iters=3, timeout_s=120,
                      local_codecs=True)  # fmt: skip
    if result is not None:
        with open(out, "w") as f:
            json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # as runners/train.py: no C++ static destructors after a compressor's worker thread


def test_codecs_in_place_with_local_collectives_measure_every_compressor(tmp_path):
    out = tmp_path / "lockstep.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, 2, str(tmp_path / "store"), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:  # a rank still alive at the deadline: ended by its PID
            if p.is_alive():
                p.kill()
                p.join(10)
    data = json.loads(out.read_text())
    codecs = data["codecs"]
    assert sorted(codecs) == ["powersgd", "syncsgd", "topk"]  # every compressor measured in place
    for name in ("powersgd", "topk"):  # their codecs ran in the hooks: encode measured, and a whole step
        assert codecs[name]["encode_s"] > 0, (name, codecs[name])
        assert codecs[name]["step_s"] >= codecs[name]["backward_s"] > 0, (name, codecs[name])
    assert codecs["syncsgd"]["encode_s"] == 0 and codecs["syncsgd"]["step_s"] > 0  # the identity on one rank
