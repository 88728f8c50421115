"""Time to accuracy on the real Fashion-MNIST (issue 33), 2 emulated hosts, the small CNN, gloo ranks (root).

One convergence run (unshaped), one throughput run and one direct run to target at a shaped rate, reused for every
assertion: sync SGD reaches the stated target within a bounded number of steps, the stored curve, evaluation counts
summing to 10,000 across ranks, the stop at the target, the same curve at two rates for sync SGD and PowerSGD (synchronous training takes the
same steps at any rate), and the composed time to accuracy against the direct shaped run. About a minute on 2 cores
(5 trials: a low target, 0.3, reached at step 80, keeps the four runs to target short; a 10-iteration throughput run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
# sync SGD, lr 0.05, batch 32 x 2, seed 0: 0.228 at step 40, 0.329 at 80 (PowerSGD 0.227, 0.312; 0.5 only near
# step 150): a low target keeps the 4 runs to target short; any target crossed between two evaluations proves the same
TARGET, MAX_STEPS, EVAL_EVERY = 0.3, 200, 40
LEARN = ["--model", "cnn", "--data", "fashion-mnist", "--batch-size", "32", "--lr", "0.05", "--warmup-iters", "2",
         "--no-probe"]  # fmt: skip
BOTH = ["--compressor", "syncsgd,powersgd"]  # PowerSGD: a seeded sketch, error feedback, a communication worker
TO_TARGET = ["--eval-every", str(EVAL_EVERY), "--target-accuracy", str(TARGET), "--max-steps", str(MAX_STEPS)]
RATE = "20mbit"


@pytest.fixture(autouse=True)
def _needs_fashion_mnist():
    if not Path(DATA).is_file():
        pytest.fail(f"{DATA} missing: `make test` installs the Debian package dataset-fashion-mnist (SYSTEM_PACKAGES)")


def _ok(done, what):
    assert done.returncode == 0, f"{what}: {done.stdout[-1500:]} {done.stderr[-1500:]}"


def test_time_to_accuracy_on_fashion_mnist(make_cluster, testbed_cli, tmp_path):
    from testbed.report import report_from_dir
    from testbed.results import SCHEMA_VERSION, load_results

    name = make_cluster(2)
    out = tmp_path / "res"
    common = ["--name", name, "--out", str(out), "--world-size", "2", *LEARN]
    _ok(testbed_cli("sweep", *common, *BOTH, "--bw", "none", *TO_TARGET, "--seeds", "1", timeout_s=600), "convergence")
    _ok(testbed_cli("run", *common, "--bw", RATE, "--iters", "10", timeout_s=300), "throughput")
    _ok(testbed_cli("sweep", *common, *BOTH, "--bw", RATE, *TO_TARGET, timeout_s=600), "direct")
    df = load_results(out)
    assert (df["status"] == "ok").all(), df[["status", "error"]].to_string()
    runs = df[df["target_accuracy"].notna()].set_index(["compressor", "rate_bps"])
    conv, direct = runs.loc[("syncsgd", 0)], runs.loc[("syncsgd", 20_000_000)]
    thr = df[df["target_accuracy"].isna()].iloc[0]

    # sync SGD reaches the stated target within the bounded budget, and the trial stops there
    assert conv["data"] == "fashion-mnist" and conv["schema_version"] == SCHEMA_VERSION
    assert conv["reached_target"] and conv["steps_to_target"] <= MAX_STEPS
    assert conv["steps_run"] == conv["steps_to_target"] < MAX_STEPS
    curve = json.loads(conv["curve"])
    assert [p["step"] for p in curve] == list(range(EVAL_EVERY, int(conv["steps_to_target"]) + 1, EVAL_EVERY))
    assert curve[-1]["test_accuracy"] >= TARGET > max(p["test_accuracy"] for p in curve[:-1])
    assert conv["final_test_accuracy"] == curve[-1]["test_accuracy"]
    assert curve[-1]["train_time_s"] == conv["train_time_to_target_s"] == conv["train_time_s"]
    assert curve[0]["train_loss"] > curve[-1]["train_loss"] and all(p["test_loss"] > 0 for p in curve)
    # evaluation: the whole test split, sharded across the ranks and summed; its time kept apart from training
    assert conv["eval_samples"] == 10_000 and all(p["eval_samples"] == 10_000 for p in curve)
    summary = json.loads((out / "trials" / runs.loc[("syncsgd", 0), "trial_id"] / "summary.json").read_text())
    assert summary["eval_counts_per_rank"] == [5000, 5000]
    assert conv["eval_time_s"] == pytest.approx(sum(p["eval_s"] for p in curve))
    assert conv["eval_time_s"] > 0 and conv["train_time_s"] + conv["eval_time_s"] < conv["wall_s"]  # disjoint parts

    # synchronous training takes the same steps at any link rate: the same seed gives the same curve at 20 Mbit/s,
    # for sync SGD and for PowerSGD (its sketch seeded, its error feedback and worker thread deterministic)
    for comp in ("syncsgd", "powersgd"):
        unshaped, at_rate = runs.loc[(comp, 0)], runs.loc[(comp, 20_000_000)]
        assert unshaped["reached_target"] and at_rate["steps_to_target"] == unshaped["steps_to_target"], comp
        a_curve, b_curve = json.loads(at_rate["curve"]), json.loads(unshaped["curve"])
        assert [p["test_accuracy"] for p in a_curve] == [p["test_accuracy"] for p in b_curve], comp
        for a, b in zip(a_curve, b_curve, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6), comp
            assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6), comp

    # the report composes time to accuracy at 20 Mbit/s = steps to target x the throughput run's iteration time,
    # and checks it against the direct shaped run to target
    rep = report_from_dir(out, tmp_path / "report")
    tta = rep.tables["time_to_accuracy"]
    at = tta[(tta["rate_bps"] == 20_000_000) & (tta["compressor"] == "syncsgd")].iloc[0]
    assert at["source"] == "measured"
    assert at["tta_s"] == pytest.approx(conv["steps_to_target"] * thr["iter_time_s_mean"])
    errs = rep.tables["tta_composition_errors"]
    err = errs[errs["compressor"] == "syncsgd"].iloc[0]
    assert err["checks"] == "time to target"
    assert err["direct_steps"] == err["composed_steps"] == conv["steps_to_target"]
    assert err["direct_s"] == pytest.approx(direct["train_time_to_target_s"])
    print(f"composed {err['composed_s']:.2f} s vs direct {err['direct_s']:.2f} s: {err['error_pct']:+.1f} %")
    # no bound on the error here: on a loaded 2-core machine two runs' step times differ by tens of percent (seen
    # -46 % and +28 %); the 10 % claim is bench/time_to_accuracy.py's, run on a quiet machine
    assert math.isfinite(err["error_pct"]) and err["source"] == "measured"
    summary_md = (tmp_path / "report" / "summary.md").read_text()
    assert "## Time to accuracy" in summary_md and "On time to accuracy compression won" in rep.headline
    assert "<h2>Time to accuracy</h2>" in rep.html.read_text()  # report.html has the section too
    assert any(p.name.startswith("accuracy_vs_time_") for p in rep.figures)
