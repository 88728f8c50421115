"""Issue 33 without root: data files and shards, trial ids, the time-to-accuracy composition (pure pandas)."""

from __future__ import annotations

import gzip
import json
import math

import pandas as pd
import pytest
import torch

from runners import catalog, datafiles
from runners.data import DataSource, ShardedBatches, Split
from testbed.config import Trial
from testbed.errors import InputError
from testbed.report.accuracy import (
    compose,
    composition_errors,
    composition_summary,
    crossovers,
    final_accuracy,
    headline,
)
from testbed.report.predicted import ModelSettings


def test_fashion_mnist_files_are_found_and_a_bad_idx_is_named(tmp_path):
    found = datafiles.check("fashion-mnist", catalog.FASHION_MNIST_ROOT)
    assert (found["train"], found["test"], found["classes"]) == (60000, 10000, 10)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        (tmp_path / name).write_bytes(gzip.compress(b"not idx"))
    with pytest.raises(datafiles.DataMissing, match="not an IDX file"):
        datafiles.check("fashion-mnist", str(tmp_path))
    with pytest.raises(datafiles.DataMissing, match="expected train/CLASS/IMAGE"):
        datafiles.check("imagefolder", str(tmp_path))
    with pytest.raises(datafiles.DataMissing, match="missing data_batch_1"):
        datafiles.check("cifar10", str(tmp_path))


def _source(n: int = 103) -> DataSource:
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    split = Split(images, torch.arange(n))
    return DataSource("fashion-mnist", split, split, 1, 2, 10, 0.0, 1.0)


def test_shards_are_disjoint_cover_the_epoch_and_follow_the_seed_only():
    src = _source()
    ranks = [ShardedBatches(src, rank=r, world_size=3, batch_size=4, seed=7, device=torch.device("cpu"))
             for r in range(3)]  # fmt: skip
    per_epoch = ranks[0].per_epoch  # 103 // 3 = 34 samples per rank: 8 batches of 4
    assert per_epoch == 8
    epoch0 = [torch.cat([b(s)[1] for s in range(per_epoch)]) for b in ranks]
    seen = torch.cat(epoch0)
    assert len(set(seen.tolist())) == len(seen) == 3 * 8 * 4  # disjoint, nothing repeated
    again = ShardedBatches(src, rank=1, world_size=3, batch_size=4, seed=7, device=torch.device("cpu"))
    assert torch.equal(torch.cat([again(s)[1] for s in range(per_epoch)]), epoch0[1])  # seeded, nothing else
    assert not torch.equal(ranks[1].shard(1), ranks[1].shard(0))  # a new order every epoch
    other = ShardedBatches(src, rank=1, world_size=3, batch_size=4, seed=8, device=torch.device("cpu"))
    assert not torch.equal(other.shard(0), ranks[1].shard(0))
    x, y = ranks[0](0)
    assert x.dtype == torch.float32 and torch.equal(x[:, 0, 0, 0], y.float() / 255.0)


def test_synthetic_trials_keep_their_ids_and_learning_settings_change_them():
    t = Trial("syncsgd", None, 2)
    assert not {"data", "eval_every", "target_accuracy", "max_steps", "lr"} & set(t.config())
    learn = Trial("syncsgd", None, 2, model="cnn", data="fashion-mnist", eval_every=50, target_accuracy=0.8,
                  max_steps=300)  # fmt: skip
    assert learn.trial_id != t.trial_id and learn.config()["data"] == "fashion-mnist"
    with pytest.raises(InputError, match="does not train on"):
        Trial("syncsgd", None, 2, model="bert-base", data="fashion-mnist")


def _row(comp, rate, seed, *, steps=None, it=None, target=0.8, curve=None, direct_s=None, ran=None, train_s=None):
    conv = target is not None
    return {"model": "cnn", "batch_size": 32, "world_size": 2, "data": "fashion-mnist", "variant": comp,
            "compressor": comp, "rate_bps": rate, "seed": seed, "target_accuracy": target if conv else None,
            "eval_every": 50 if curve else None, "steps_to_target": steps, "iter_time_s_mean": it, "t_s": it,
            "curve": json.dumps(curve) if curve else None, "train_time_to_target_s": direct_s,
            "steps_run": ran or steps, "train_time_s": train_s or direct_s}  # fmt: skip


def test_composition_crossovers_never_and_the_headline():
    curve = [{"step": 50, "test_accuracy": 0.5}, {"step": 100, "test_accuracy": 0.8}]
    conv = pd.DataFrame([
        _row("syncsgd", 0, 0, steps=100, curve=curve), _row("syncsgd", 0, 1, steps=200, curve=curve),
        _row("powersgd", 0, 0, steps=300, curve=curve), _row("powersgd", 0, 1, steps=300, curve=curve),
        _row("signsgd", 0, 0, steps=None, curve=curve),
        _row("syncsgd", 10_000_000, 0, steps=100, curve=curve, direct_s=55.0),
        _row("signsgd", 10_000_000, 0, steps=None, curve=curve, ran=400, train_s=36.0),  # stopped at --max-steps
    ])  # fmt: skip
    thr = pd.DataFrame([_row(c, r, 0, it=it, target=None) for c, r, it in (
        ("syncsgd", 10_000_000, 0.5), ("syncsgd", 1_000_000_000, 0.05),
        ("powersgd", 10_000_000, 0.1), ("powersgd", 1_000_000_000, 0.04),
        ("signsgd", 10_000_000, 0.1), ("signsgd", 1_000_000_000, 0.04),
        ("syncsgd", 10_000_000, 0.6), ("syncsgd", 10_000_000, 0.4))])  # fmt: skip (three sync SGD launches at 10M)
    tta, notes = compose(thr, conv, (), ModelSettings(), "syncsgd")
    at = tta.set_index(["compressor", "rate_bps"])
    assert at.loc[("syncsgd", 10_000_000), "tta_s"] == pytest.approx(150 * 0.5)  # mean over seeds x median launch
    assert at.loc[("syncsgd", 10_000_000), "iter_time_spread_pct"] == pytest.approx(50.0)  # 0.6 s against 0.4 s
    assert at.loc[("powersgd", 10_000_000), "iter_time_spread_pct"] == 0.0
    assert at.loc[("powersgd", 10_000_000), "tta_s"] == pytest.approx(300 * 0.1)
    assert at.loc[("powersgd", 1_000_000_000), "tta_speedup"] == pytest.approx(150 * 0.05 / (300 * 0.04))
    assert math.isinf(at.loc[("signsgd", 10_000_000), "tta_s"]) and (at["source"] == "measured").all()
    cx = crossovers(tta, "syncsgd").set_index("compressor")
    # powersgd: 2.5x faster per step at 10 Mbit, 0.625x on time to accuracy at 1 Gbit (twice the steps)
    assert cx.loc["powersgd", "time-to-accuracy crossover"] not in ("always", "never", "n/a")
    assert cx.loc["powersgd", "throughput crossover"] == "always"
    assert cx.loc["signsgd", "time-to-accuracy crossover"] == "never reaches 0.8"
    text, n_tta, n_thr, m = headline(tta, "syncsgd")
    assert (n_tta, n_thr, m) == (1, 4, 4) and "won in 1 of 4" in text
    # the direct run (seed 0) is checked against seed 0's own steps x the iteration time, not the mean over seeds
    errs = composition_errors(tta, conv).set_index("compressor")
    err = errs.loc["syncsgd"]
    assert err["checks"] == "time to target"
    assert err["composed_steps"] == 100 and err["steps_from"] == "seed 0"
    assert err["composed_s"] == pytest.approx(50.0) and err["error_pct"] == pytest.approx((50 - 55) / 55 * 100)
    # without an unshaped run of its seed: the mean over the seeds that reached the target, said so
    # a direct run that stopped at --max-steps checks the time per step: the 400 steps it ran x the iteration time
    err = errs.loc["signsgd"]
    assert (err["checks"], err["steps_from"]) == ("time per step", "steps run (target not reached)")
    assert err["composed_s"] == pytest.approx(400 * 0.1) and err["error_pct"] == pytest.approx((40 - 36) / 36 * 100)
    err = composition_errors(tta, conv.assign(seed=conv["seed"].where(conv["rate_bps"] == 0, 7))).iloc[0]
    assert err["composed_steps"] == 150 and err["steps_from"] == "mean over 2 seeds" and err["composed_s"] == 75.0
    final = final_accuracy(conv).set_index("compressor")
    assert final.loc["powersgd", "accuracy_mean"] == 0.8 and final.loc["powersgd", "budget_steps"] == 100


def test_composition_summary_takes_the_median_over_direct_launches_and_states_their_spread():
    """Three direct launches of one compressor at one rate: the summary's error is their median (one launch's
    compute can run tens of percent apart from another's), and the spread of their own time per step is stated."""
    errors = pd.DataFrame([{"model": "cnn", "world_size": 2, "compressor": "topk", "bandwidth": "2mbit", "seed": s,
                            "checks": c, "direct_steps": steps, "direct_s": d, "error_pct": e,
                            "throughput_spread_pct": 18.0}
                           for s, c, steps, d, e in ((0, "time to target", 100, 10.0, 30.0),
                                                     (1, "time per step", 200, 24.0, -2.0),
                                                     (2, "time to target", 100, 11.0, 5.0))])  # fmt: skip
    row = composition_summary(errors).iloc[0]
    assert (row["launches"], row["to_target"]) == (3, 2) and row["median_error_pct"] == 5.0
    assert (row["min_error_pct"], row["max_error_pct"]) == (-2.0, 30.0)
    assert row["launch_spread_pct"] == pytest.approx((0.12 / 0.10 - 1) * 100)  # 120 ms against 100 ms per step
    assert row["throughput_spread_pct"] == 18.0  # the composition's own launches, carried beside
    assert composition_summary(pd.DataFrame()).empty


def test_cifar10_and_imagefolder_layouts_load_with_their_shapes(tmp_path):
    """The lab data sets (`cifar10:DIR`, `imagefolder:DIR`) through the same loader, from tiny fakes."""
    import pickle

    import numpy as np
    from PIL import Image

    from runners.data import load

    base = tmp_path / "cifar" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for name in datafiles.CIFAR_FILES:
        batch = {"data": np.full((4, 3072), 7, dtype=np.uint8), "labels": [0, 1, 2, 3]}
        (base / name).write_bytes(pickle.dumps(batch))
    src = load(f"cifar10:{tmp_path / 'cifar'}", 64)
    assert src.train.images.shape == (20, 3, 32, 32) and src.test.images.shape == (4, 3, 32, 32)
    assert (src.channels, src.image_size, src.classes) == (3, 32, 10)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / "imgs" / split / cls).mkdir(parents=True)
            Image.new("L", (20, 10), 128).save(tmp_path / "imgs" / split / cls / "a.png")  # grayscale: made RGB
    src = load(f"imagefolder:{tmp_path / 'imgs'}", 16)
    assert src.train.images.shape == (2, 3, 16, 16) and src.classes == 2 and src.test.labels.tolist() == [0, 1]


def test_rates_without_a_measurement_are_predicted_and_marked():
    from testbed import perfmodel as pm

    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="cnn", batch_size=32))
    curve = [{"step": 100, "test_accuracy": 0.8}]
    conv = pd.DataFrame([_row("syncsgd", 0, 0, steps=100, curve=curve), _row("powersgd", 0, 0, steps=120, curve=curve)])
    thr = pd.DataFrame([_row("syncsgd", 10_000_000, 0, it=0.5, target=None)])
    tta, _ = compose(thr, conv, [prof], ModelSettings(), "syncsgd")
    at = tta.set_index("compressor")
    assert at.loc["syncsgd", "source"] == "measured" and at.loc["powersgd", "source"] == "predicted"
    from testbed.report.predicted import network

    net = network(2, 10_000_000, 0.0, ModelSettings())  # the report's own terms (default latency and efficiency)
    predicted = pm.predict_iteration(prof, "powersgd", net, hook_blocks_backward=True).iter_time_s
    assert at.loc["powersgd", "tta_s"] == pytest.approx(120 * predicted)
