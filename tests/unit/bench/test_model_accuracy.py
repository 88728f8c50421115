"""bench/model_accuracy.py's held-out planning and noise figures (issue 32): the parts that decide how many steps a
trial measures, which `testbed sweep` runs them, and what the seed reports as the measurement's own noise. The bench
itself runs for hours on a quiet machine; these are its pure functions, over plans and a results store made here."""

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.results import ResultsStore
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("model_accuracy", REPO / "bench" / "model_accuracy.py")
ma = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ma)

# fast compute (cnn bs8: ~6 ms a step), a slow wire at 100 Mbit/s for sync SGD only (bert-base: 438 MB of gradients)
FAST = {"model": "cnn", "hosts": 2, "batch_size": 8, "compressors": ["syncsgd", "topk"], "bw": ["100mbit", "none"],
        "bucket_cap_mb": 25}
# issue 32's configuration: a compute step of ~0.2 s, sync SGD's wire at 100 Mbit/s ~5 s
ISSUE = {"model": "resnet18", "hosts": 3, "batch_size": 16, "compressors": ["syncsgd", "fp16", "topk"],
         "bw": ["100mbit", "1gbit", "none"], "bucket_cap_mb": 25}
BERT = {"model": "bert-base", "hosts": 3, "batch_size": 8, "compressors": ["syncsgd", "fp16", "topk"],
        "bw": ["100mbit", "1gbit", "none"], "bucket_cap_mb": 25}


def test_without_min_measured_s_every_trial_keeps_its_iterations_and_one_grid_runs_them():
    assert ma.trial_iters(BERT, "syncsgd", "100mbit", 6, 5, 0.0) == (6, 5)
    assert ma.profile_iters(BERT, 6, 0.0) == 10  # a profile's least
    assert ma.sweep_groups(BERT, 6, 5, 0.0) == [(BERT["bw"], BERT["compressors"], 6, 5)]


def test_a_fast_step_measures_for_the_time_asked_up_to_max_iters_with_warmup_in_proportion_up_to_its_cap():
    # seed 3, configuration 2: cnn bs8 on 2 hosts, ~15 ms steps, measured 40 of them (0.6 s of the 8 s asked for)
    one = ma.trial_step_s(FAST, "topk", "none")
    n, w = ma.trial_iters(FAST, "topk", "none", 6, 5, 8.0)
    assert n == ma.MAX_ITERS and n * 0.015 >= 7.5  # 8 s of ~12 ms steps (the estimate) would be ~700: capped
    assert w == ma.MAX_WARMUP_ITERS < math.ceil(5 * n / 6)  # warm-up in proportion would be 417 steps
    # a step that needs fewer than MAX_ITERS: just enough to last the time, and the warm-up in proportion below the cap
    n, w = ma.trial_iters(FAST, "topk", "none", 6, 5, 2.0)
    assert (n - 1) * one < 2.0 <= n * one and n > 40
    assert w == ma.MAX_WARMUP_ITERS
    n, w = ma.trial_iters(FAST, "topk", "none", 6, 5, 0.3)
    assert n == math.ceil(0.3 / one) and w == max(5, math.ceil(5 * n / 6)) < ma.MAX_WARMUP_ITERS
    assert ma.profile_iters(FAST, 6, 8.0) == ma.MAX_PROFILE_ITERS  # a profile is launched again instead


def test_a_trial_of_forty_steps_or_fewer_is_planned_as_before_the_caps_changed():
    """MAX_ITERS rose from 40 to 500 after seed 3; a trial that needed 40 steps or fewer gets what it got before."""
    for c in ISSUE["compressors"]:
        for r in ISSUE["bw"]:
            n, w = ma.trial_iters(ISSUE, c, r, 6, 5, 8.0)
            old_n = min(40, max(6, math.ceil(8.0 / ma.trial_step_s(ISSUE, c, r))))
            assert (n, w) == (old_n, max(5, math.ceil(5 * old_n / 6)))


def test_a_slow_wire_bound_step_keeps_its_iterations():
    step = ma.trial_step_s(BERT, "syncsgd", "100mbit")
    assert step > 8.0  # the estimate alone lasts longer than 8 s: more steps would buy nothing
    assert ma.trial_iters(BERT, "syncsgd", "100mbit", 6, 5, 8.0) == (6, 5)
    # between the two: just enough steps to last the time, by the estimate
    n, _ = ma.trial_iters(BERT, "topk", "none", 2, 1, 30.0)
    one = ma.trial_step_s(BERT, "topk", "none")
    assert (n - 1) * one < 30.0 <= n * one


def test_sweep_groups_run_each_trial_once_with_its_own_counts():
    groups = ma.sweep_groups(ISSUE, 6, 5, 8.0)
    seen = [(r, c, n, w) for rates, comps, n, w in groups for r in rates for c in comps]
    assert len(seen) == len(set((r, c) for r, c, _, _ in seen)) == len(ISSUE["bw"]) * len(ISSUE["compressors"])
    for r, c, n, w in seen:
        assert (n, w) == ma.trial_iters(ISSUE, c, r, 6, 5, 8.0)
    assert len(groups) > 1  # counts differ across the grid: one sweep would have measured them alike


def test_trial_timeout_covers_the_slowest_trial_three_times_and_never_under_the_sweeps_own():
    assert ma.trial_timeout_s(FAST, FAST["compressors"], FAST["bw"], 6, 5) == 600
    slow = ma.trial_timeout_s(BERT, ["syncsgd"], ["100mbit"], 6, 5)
    assert slow >= 3 * 11 * ma.trial_step_s(BERT, "syncsgd", "100mbit")


def test_the_same_seed_draws_the_same_configurations_within_the_space_and_redraws_what_is_rejected():
    a, _ = ma.draw_configs(5, 4)
    b, _ = ma.draw_configs(5, 4)
    assert a == b and len(a) == 4
    sp = ma.HOLDOUT_SPACE
    for c in a:
        assert sp["hosts"][0] <= c["hosts"] <= sp["hosts"][1] and c["batch_size"] in sp["batch"]
        assert c["model"] in sp["models"] and c["bucket_cap_mb"] in sp["bucket_cap_mb"]
        assert c["compressors"][0] == "syncsgd" and set(c["compressors"][1:]) <= set(sp["compressors"])
        assert c["bw"][-1] == "none" and 4 <= len(c["bw"]) <= 6
    kept, left = ma.draw_configs(5, 3, reject=lambda c: "too big" if c["hosts"] > 3 else None)
    assert len(kept) == 3 and all(c["hosts"] <= 3 for c in kept)
    assert all(c["hosts"] > 3 and why == "too big" for c, why in left)


def test_launch_spread_and_an_exact_models_expected_error():
    medians = [[1.0, 1.2], [2.0, 2.0], [1.0, 1.1, 1.3]]
    assert ma.launch_spread_pct(medians) == pytest.approx([20.0, 0.0, 30.0])
    # two launches: |a - b| / 2 over their mean; three: the mean absolute deviation / sqrt(2) over the mean
    mean3 = 3.4 / 3
    mad3 = (abs(1.0 - mean3) + abs(1.1 - mean3) + abs(1.3 - mean3)) / 3
    assert ma.noise_floor_pct(medians) == pytest.approx([0.1 / 1.1 * 100, 0.0, mad3 / math.sqrt(2) / mean3 * 100])


def store_trial(store: ResultsStore, trial_id: str, compressor: str, p50: float, per_rank: list[list[float]]) -> None:
    d = store.trial_dir(trial_id)
    for r, steps in enumerate(per_rank):
        (d / f"rank{r}.jsonl").write_text("".join(json.dumps({"iter_time_s": s}) + "\n" for s in steps))
    (d / "summary.json").write_text(json.dumps({"config": {"model": "cnn", "compressor": compressor}}))
    store.append({"trial_id": trial_id, "status": "ok", "model": "cnn", "batch_size": 8, "world_size": 2,
                  "compressor": compressor, "compressor_options": "{}", "rate_bps": 0, "iter_time_s_p50": p50})


def test_noise_over_a_results_store(tmp_path):
    store = ResultsStore(tmp_path)
    # sync SGD launched twice (medians 1.0 and 1.2 s), its steps steady; Top-K once, its steps spread
    store_trial(store, "a" * 16, "syncsgd", 1.0, [[1.0] * 6, [0.9] * 6])
    store_trial(store, "b" * 16, "syncsgd", 1.2, [[1.2] * 6, [1.1] * 6])
    store_trial(store, "c" * 16, "topk", 1.0, [[0.5, 1.5, 0.7, 1.3, 0.9, 1.1], [0.1] * 6])
    n = ma.noise(tmp_path)
    assert n["launch_spread"] == pytest.approx([20.0])  # only what ran more than once
    assert n["noise_floor"] == pytest.approx([0.1 / 1.1 * 100])
    sd = sorted(n["sampling_sd"])
    assert sd[:2] == [0.0, 0.0] and sd[2] > 5.0  # steady steps: the median cannot move; spread ones: it does
    text = ma.describe_noise(n)
    assert "20.0 % apart" in text and "9.1 %" in text


def store_launch(store: ResultsStore, trial_id: str, compressor: str, rate_bps: int, p50: float,
                 model: str = "cnn", world_size: int = 2, status: str = "ok") -> None:  # fmt: skip
    store.append({"trial_id": trial_id, "status": status, "model": model, "batch_size": 8, "world_size": world_size,
                  "compressor": compressor, "compressor_options": "{}", "rate_bps": rate_bps,
                  "iter_time_s_p50": p50})  # fmt: skip


def test_the_settings_whose_launches_disagree_are_launched_once_more_and_no_others(tmp_path, monkeypatch):
    """Seed 7, configuration 6: Multi-Sampling Top-K at 100 Mbit/s launched at 1858 and 2999 ms and was scored
    against their median, 2430 ms. A setting whose launches lie more than the asked share of their mean from it is
    launched once more (a median of three); which ones depends on the launches alone."""
    store = ResultsStore(tmp_path)
    cfg = {**FAST, "compressors": ["syncsgd", "topk", "mstopk"]}
    store_launch(store, "a1", "syncsgd", 100_000_000, 1.00)
    store_launch(store, "a2", "syncsgd", 100_000_000, 1.04)  # 2.0 % of their mean: settled
    store_launch(store, "b1", "topk", 100_000_000, 1.858)
    store_launch(store, "b2", "topk", 100_000_000, 2.999)  # 23.5 %: launched again
    store_launch(store, "c1", "topk", 0, 1.00)
    store_launch(store, "c2", "topk", 0, 1.12)  # 5.7 %, unshaped: launched again at 'none'
    store_launch(store, "d1", "mstopk", 0, 1.0)
    store_launch(store, "d2", "mstopk", 0, 1.5)
    store_launch(store, "d3", "mstopk", 0, 1.0)  # launched again already (a resumed run): not a fourth time
    store_launch(store, "e1", "syncsgd", 0, 1.0)
    store_launch(store, "e2", "syncsgd", 0, 2.0, status="failed")  # one ok launch: nothing to compare
    store_launch(store, "f1", "mstopk", 100_000_000, 1.0)
    store_launch(store, "f2", "mstopk", 100_000_000, 1.0, model="resnet18")  # another model's,
    store_launch(store, "f3", "mstopk", 100_000_000, 2.0, world_size=4)  # and another world size's: not this one's
    assert ma.unsettled(tmp_path, cfg, 2, 5.0) == [("topk", "100mbit"), ("topk", "none")]
    assert ma.unsettled(tmp_path, cfg, 2, 10.0) == [("topk", "100mbit")]
    assert ma.unsettled(tmp_path, cfg, 3, 5.0) == [("mstopk", "none")]
    assert ma.unsettled(tmp_path / "empty", cfg, 2, 5.0) == []  # nothing stored yet
    asked = []
    monkeypatch.setattr(ma, "testbed", lambda *argv, timeout_s=0: asked.append(argv) or "")
    assert ma.launch_again(tmp_path, cfg, 2, 5.0, 6, 5, 8.0, 25.0) == [("topk", "100mbit", 3), ("topk", "none", 3)]
    assert [(a[a.index("--compressor") + 1], a[a.index("--bw") + 1]) for a in asked] == [("topk", "100mbit"),
                                                                                         ("topk", "none")]  # fmt: skip
    for a, (c, r) in zip(asked, [("topk", "100mbit"), ("topk", "none")], strict=True):
        assert a[0] == "sweep" and a[a.index("--seed") + 1] == "2"  # the seed after the repetitions' 0 and 1
        its, warm = ma.trial_iters(cfg, c, r, 6, 5, 8.0)  # the counts its repetitions ran with
        assert (a[a.index("--iters") + 1], a[a.index("--warmup-iters") + 1]) == (str(its), str(warm))
        assert a[a.index("--world-size") + 1] == "2" and a[a.index("--model") + 1] == "cnn"
    # the estimate counts the launches again: RELAUNCH_SHARE of a repetition's trials more
    plain, again = ma.estimate_wall_s(ISSUE, 6, 2, 5, 8.0), ma.estimate_wall_s(ISSUE, 6, 2, 5, 8.0, 5.0)
    one_rep = ma.estimate_wall_s(ISSUE, 6, 2, 5, 8.0) - ma.estimate_wall_s(ISSUE, 6, 1, 5, 8.0)  # trials + profiles
    its_profiles = ma.profile_launches(ISSUE, 6, 8.0) * (60 + 1.5 * 3 * ma.profile_iters(ISSUE, 6, 8.0)
                                                          * ma.step_s(ISSUE))  # fmt: skip
    one_profile = 60 + 1.5 * 3 * ma.profile_iters(ISSUE, 6, 8.0) * ma.step_s(ISSUE)
    # and a profile launch before the round of launches again (`interleave`'s reason, seed 9)
    assert again - plain == pytest.approx(ma.RELAUNCH_SHARE * (one_rep - its_profiles) + one_profile)


def test_one_more_launch_moves_a_median_by_at_most_half_the_gap_to_its_farther_neighbour():
    assert ma.median_move_pct([1.858, 2.999]) == pytest.approx(ma.half_spread_pct([1.858, 2.999]))  # two: the same
    assert ma.median_move_pct([2.999, 1.858, 2.430]) == pytest.approx(0.572 / 2 / 2.430 * 100)  # the farther one
    assert ma.median_move_pct([1.0, 1.01, 1.02, 2.0]) == pytest.approx(0.01 / 2 / 1.015 * 100)  # the middle two
    assert ma.median_move_pct([0.715, 0.736, 0.817]) > 5.0 > ma.median_move_pct([0.774, 0.825, 0.858])  # seed 8, 1


def test_a_setting_is_launched_again_until_settled_or_at_the_most_launches(tmp_path, monkeypatch):
    """--max-launches: an unsettled setting goes on being launched, each time with the next seed, until one more
    launch could move its median by at most the asked share, or it has the most launches asked for."""
    store = ResultsStore(tmp_path)
    cfg = {**FAST, "compressors": ["syncsgd", "topk"]}
    store_launch(store, "a1", "syncsgd", 100_000_000, 1.00)
    store_launch(store, "a2", "syncsgd", 100_000_000, 1.04)  # settled at two
    store_launch(store, "b1", "topk", 100_000_000, 1.858)
    store_launch(store, "b2", "topk", 100_000_000, 2.999)
    store_launch(store, "c1", "topk", 0, 1.00)
    store_launch(store, "c2", "topk", 0, 1.12)
    # what the next launches measure: topk at 100mbit stays open after its third (12.8 %), settles at its fourth
    # (1.0 %); topk unshaped settles at its third (3.3 %)
    measured = {("topk", 100_000_000, "2"): 2.5, ("topk", 100_000_000, "3"): 2.45, ("topk", 0, "2"): 1.05}
    asked = []

    def sweep(*argv, timeout_s=0):
        c, rate, seed = argv[argv.index("--compressor") + 1], argv[argv.index("--bw") + 1], argv[argv.index("--seed") + 1]
        asked.append((c, rate, seed))
        store_launch(store, f"{c}-{rate}-{seed}", c, ma.rate_key(rate), measured[(c, ma.rate_key(rate), seed)])
        return ""

    monkeypatch.setattr(ma, "testbed", sweep)
    profiled = []  # a profile launch before each round that launches anything, in the order they ran
    assert ma.launch_again(tmp_path, cfg, 2, 5.0, 6, 5, 8.0, 25.0, max_launches=5,
                           profile=lambda k: asked.append(("profile", k))) == [
        ("topk", "100mbit", 3), ("topk", "none", 3), ("topk", "100mbit", 4)]  # fmt: skip
    assert asked == [("profile", 1), ("topk", "100mbit", "2"), ("topk", "none", "2"), ("profile", 2),
                     ("topk", "100mbit", "3")]  # the fourth round has nothing unsettled: no profile launch  # fmt: skip
    # a resumed run launches nothing more: every setting is settled, or launched again already
    assert ma.launch_again(tmp_path, cfg, 2, 5.0, 6, 5, 8.0, 25.0, max_launches=5,
                           profile=profiled.append) == []  # fmt: skip
    assert len(asked) == 5 and profiled == []


def test_the_estimate_counts_the_further_launches_again():
    assert ma.relaunch_share(2, 0.0, 5) == 0.0  # no launch again
    assert ma.relaunch_share(2, 5.0) == ma.relaunch_share(2, 5.0, 3) == ma.RELAUNCH_SHARE  # once: as before
    assert ma.relaunch_share(2, 5.0, 4) == pytest.approx(ma.RELAUNCH_SHARE * (1 + ma.RELAUNCH_DECAY))
    plain, most = ma.estimate_wall_s(ISSUE, 6, 2, 5, 8.0, 5.0), ma.estimate_wall_s(ISSUE, 6, 2, 5, 8.0, 5.0, 4)
    assert most > plain


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/model_accuracy.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, named", [(["--min-measured-s", "-1"], "--min-measured-s -1"),
                                         (["--min-measured-s", "nan"], "--min-measured-s nan"),
                                         (["--iters", "0"], "--iters 0"),
                                         (["--calibrate-bw", "1gbit,1000mbit"], "1000mbit names a rate given before"),
                                         (["--calibrate-bw", "none,unshaped"], "unshaped names a rate given before"),
                                         (["--calibrate-bw", "1gbit,0"], "--calibrate-bw"),
                                         (["--relaunch-beyond-pct", "-1"], "--relaunch-beyond-pct -1"),
                                         (["--relaunch-beyond-pct", "100"], "--relaunch-beyond-pct 100"),
                                         (["--relaunch-beyond-pct", "nan"], "--relaunch-beyond-pct nan"),
                                         (["--max-launches", "4"], "only with --relaunch-beyond-pct"),
                                         (["--relaunch-beyond-pct", "5", "--max-launches", "2"],
                                          "expected more launches than the 2 repetitions"),
                                         (["--relaunch-beyond-pct", "5", "--repeats", "3", "--max-launches", "3"],
                                          "--max-launches 3")])
def test_bad_input_is_one_line_and_exit_2(args, named, tmp_path):
    done = run_bench("--holdout", "99", "--out", str(tmp_path / "w"), *args)
    assert done.returncode == 2
    assert named in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()


def test_a_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    done = run_bench("--holdout", "3", "--configs", "2", "--iters", "6", "--min-measured-s", "8", "--dry-run",
                     "--out", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    assert "Held-out validation, seed 3: 2 configurations" in done.stdout
    assert "estimated wall time" in done.stdout
    assert "launched again" not in done.stdout
    assert not (tmp_path / "w").exists()
    again = run_bench("--holdout", "3", "--configs", "2", "--iters", "6", "--min-measured-s", "8", "--dry-run",
                      "--relaunch-beyond-pct", "5", "--out", str(tmp_path / "w"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert ("a setting launched again while one more launch could move its median by more than 5 % (up to 3 "
            "launches)") in again.stdout  # fmt: skip
    most = run_bench("--holdout", "3", "--configs", "2", "--iters", "6", "--min-measured-s", "8", "--dry-run",
                     "--relaunch-beyond-pct", "5", "--max-launches", "5", "--out", str(tmp_path / "w"))  # fmt: skip
    assert most.returncode == 0, most.stderr
    assert "(up to 5 launches)" in most.stdout

    def minutes(out: str) -> list[int]:  # each configuration's estimate
        return [int(m) for m in re.findall(r"\(about (\d+) min\)", out)]

    # the launches again are in each configuration's estimate
    plain, more = minutes(done.stdout), minutes(again.stdout)
    assert len(plain) == 2 and all(a > b for a, b in zip(more, plain, strict=True))
    assert all(a >= b for a, b in zip(minutes(most.stdout), more, strict=True))  # and the further ones


def finished_config(out: Path, errors: str, verdicts: list[str]) -> None:
    """A configuration as the bench leaves it finished: its report's errors (CSV rows compressor,bandwidth,bound_by,
    error_pct) and crossover verdicts, and sync SGD unshaped launched twice (medians 1.0 and 1.2 s)."""
    report = out / "report"
    report.mkdir(parents=True)
    (report / "prediction_error.csv").write_text("compressor,bandwidth,bound_by,error_pct\n" + errors)
    (report / "crossovers.csv").write_text("verdict\n" + "".join(f'"{v}"\n' for v in verdicts))
    store = ResultsStore(out / "results")
    store_trial(store, "a" * 16, "syncsgd", 1.0, [[1.0] * 6])
    store_trial(store, "b" * 16, "syncsgd", 1.2, [[1.2] * 6])


def test_a_seeds_table_scores_the_finished_configurations_and_names_the_rest(tmp_path):
    from testbed.perfmodel.synthetic import synthetic_profile_dict

    plan = {"seed": 9, "configs": [FAST, ISSUE, BERT], "commit": "abc123", "iters": 6, "repeats": 2,
            "min_measured_s": 8.0}  # fmt: skip
    (tmp_path / "holdout.json").write_text(json.dumps(plan))
    finished_config(tmp_path / "config1", "syncsgd,unshaped,compute,-2.0\ntopk,unshaped,floor,4.0\n"
                    "syncsgd,100mbit,floor,-30.0\n", ["agrees: never", "undecided: too wide", "agrees"])
    score = ma.config_score(tmp_path / "config1")
    assert score["errors"] == [2.0, 4.0, 30.0] and score["verdicts"] == ["agrees", "undecided", "agrees"]
    # its level: the signed median (-2.0 of -2, +4, -30), and each error about it (0, 6, 28)
    assert score["levels"] == [-2.0] and score["about_level"] == [0.0, 6.0, 28.0]
    assert ma.config_score(tmp_path / "config2") is None
    pooled = ma.pool_scores([score, score])
    assert pooled["errors"] == [2.0, 4.0, 30.0] * 2 and pooled["noise"]["launch_spread"] == pytest.approx([20.0] * 2)

    table = ma.seed_table(tmp_path)
    assert "Seed 9, the model frozen at abc123, 6 measured iterations (--min-measured-s 8), 2 repetitions" in table
    row1 = next(line for line in table.splitlines() if line.startswith("| 1 |"))
    assert "| 3 | 4.0 % | 30.0 % | 20.0 % |" in row1 and "| 9.1 % | 9.1 % | -2.0 % | 28.0 % | 2 agrees, 1 undecided |" in row1
    assert "not run yet" in next(line for line in table.splitlines() if line.startswith("| 2 |"))
    # over several configurations: the range of their levels, and the worst error about each one's own level
    other = {**score, "levels": [3.0], "about_level": [1.0]}
    assert ma.pool_scores([score, other])["about_level"] == [0.0, 6.0, 28.0, 1.0]
    both = ma.seed_table(tmp_path, [score, other, None]).splitlines()
    assert "| -2.0 % to +3.0 % | 28.0 % |" in next(line for line in both if line.startswith("| all |"))
    # a sitting's deadline ended configuration 2 after one calibration, one profile launch and one ok trial (a second
    # one was interrupted): the table says where it stands, against its plan (2 x 3 compressors x 3 rates)
    started = tmp_path / "config2"
    (started / "profiles" / "3hosts-rep1").mkdir(parents=True)
    (started / "profiles" / "3hosts-rep1-launch2").mkdir()  # made, its profile not yet stored: not counted
    (started / "profiles" / "calibration-bmodel-gloo-p3-100mbit.json").write_text("{}")
    prof = synthetic_profile_dict("resnet18", 16, forward_s=0.1, backward_s=0.2)
    (started / "profiles" / "3hosts-rep1" / "resnet18-bs16-cpu-colocated3.json").write_text(json.dumps(prof))
    store = ResultsStore(started / "results")
    store_trial(store, "d" * 16, "syncsgd", 1.0, [[1.0] * 6])
    store.append({"trial_id": "e" * 16, "status": "interrupted", "model": "cnn", "batch_size": 8, "world_size": 2,
                  "compressor": "topk", "compressor_options": "{}", "rate_bps": 0})  # fmt: skip
    rows = ma.seed_table(tmp_path).splitlines()
    assert ("started: 1 of 18 trials, calibrations at 1 of 3 rates, 1 profile launch |"
            in next(line for line in rows if line.startswith("| 2 |")))  # fmt: skip
    assert "not run yet" in next(line for line in rows if line.startswith("| 3 |"))
    assert next(line for line in rows if line.startswith("| all |")).count("4.0 %") == 1  # finished ones only
    assert next(line for line in table.splitlines() if line.startswith("| all |")).count("4.0 %") == 1
    # the misses against each setting's own launches: sync SGD unshaped ran twice, 9.1 % apart: none agrees within 5 %
    assert score["settings"] == [(2.0, "compute", pytest.approx(0.1 / 1.1 * 100)), (4.0, "floor", None),
                                 (30.0, "floor", None)]
    assert "agree within 5 % of their mean: 0 of 3." in table and "Settings over 15 %: 1, bound by 1 floor." in table
    # a seed planned with --relaunch-beyond-pct says so in its header
    (tmp_path / "holdout.json").write_text(json.dumps({**plan, "relaunch_beyond_pct": 5.0}))
    assert "(--min-measured-s 8), 2 repetitions (launched again beyond 5 %):" in ma.seed_table(tmp_path)
    (tmp_path / "holdout.json").write_text(json.dumps({**plan, "relaunch_beyond_pct": 5.0, "max_launches": 5}))
    assert "2 repetitions (launched again beyond 5 %, up to 5 launches):" in ma.seed_table(tmp_path)


def test_every_launch_is_listed_in_the_order_it_ran_beside_the_score(tmp_path):
    """Seed 8's configuration 7 was described by hand with its launches paired to the wrong starts: the list comes from
    the stored rows, each launch with its own start and median step, in the order they ran."""
    plan = {"seed": 9, "configs": [FAST, ISSUE], "commit": "abc123", "iters": 6, "repeats": 2}
    (tmp_path / "holdout.json").write_text(json.dumps(plan))
    store = ResultsStore(tmp_path / "config1" / "results")
    row = {"status": "ok", "model": "cnn", "batch_size": 8, "world_size": 2, "compressor_options": "{}"}
    # stored out of time order: Top-K unshaped's third launch first, a failed launch and another model's trial too
    for tid, comp, rate, start, p50, status in (
            ("c", "topk", 0, "2026-12-07T06:57:04+00:00", 0.439, "ok"),
            ("a", "topk", 0, "2026-12-07T06:34:44+00:00", 0.422, "ok"),
            ("b", "topk", 0, "2026-12-07T06:47:59+00:00", 0.352, "ok"),
            ("d", "topk", 0, "2026-12-07T06:50:00+00:00", 9.0, "failed"),
            ("e", "syncsgd", 100_000_000, "2026-12-07T06:31:39+00:00", 2.954, "ok")):
        store.append({**row, "trial_id": tid * 16, "compressor": comp, "rate_bps": rate, "started_at": start,
                      "iter_time_s_p50": p50, "status": status, "forward_s": p50 / 4, "backward_s": p50 / 2})
    store.append({**row, "trial_id": "f" * 16, "model": "resnet18", "compressor": "topk", "rate_bps": 0,
                  "started_at": "2026-12-07T06:40:00+00:00", "iter_time_s_p50": 5.0})
    text = ma.launch_list(tmp_path)
    assert "Configuration 1 (not finished): cnn bs8, 2 hosts" in text and "Configuration 2" not in text
    topk = next(line for line in text.splitlines() if line.startswith("| topk | none |"))
    # each launch's forward + backward beside it, in the same order (the level of the machine it ran at)
    assert "| 06:34:44: 422 ms, 06:47:59: 352 ms, 06:57:04: 439 ms | 316, 264, 329 | 422 |" in topk
    assert "| syncsgd | 100mbit | 06:31:39: 2954 ms | 2216 | 2954 |" in text
    assert "syncsgd | none" not in text  # a setting with no launch yet has no row
    assert "profile launches" not in text  # none written yet
    from testbed.perfmodel.synthetic import synthetic_profile_dict

    # the profile launches beside them, in the order their files were written: forward + backward and each
    # compressor's in-place step (the floor each launch gives)
    for name, mtime, fb, step in (("2hosts-rep1-launch2", 2000, (0.1, 0.2), 0.41), ("2hosts-rep1", 1000, (0.1, 0.3), 0.45)):
        prof = synthetic_profile_dict("cnn", 8, forward_s=fb[0], backward_s=fb[1])
        prof["compressors"]["topk"]["lockstep_step_s"] = step
        f = tmp_path / "config1" / "profiles" / name / "cnn-bs8-cpu-colocated2.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(prof))
        os.utime(f, (mtime, mtime))
    text = ma.launch_list(tmp_path)
    launches = text[text.index("Its profile launches"):].splitlines()
    assert [line.split("|")[1].strip() for line in launches if line.startswith("| 2hosts")] == ["2hosts-rep1",
                                                                                                 "2hosts-rep1-launch2"]
    first = next(line for line in launches if line.startswith("| 2hosts-rep1 |"))
    assert "| 00:16:40 | 400 |" in first and "| 450 |" in first
    # finished: the score beside them
    report = tmp_path / "config1" / "report"
    report.mkdir()
    (report / "prediction_error.csv").write_text("compressor,bandwidth,bound_by,measured_ms,predicted_ms,error_pct\n"
                                                 "topk,unshaped,floor,422.0,346.0,-18.0\n")
    (report / "crossovers.csv").write_text('verdict\n"agrees"\n')
    topk = next(line for line in ma.launch_list(tmp_path).splitlines() if line.startswith("| topk | none |"))
    assert topk.endswith("| 422 | 422 | 346 | -18.0 % |")
    assert "(not finished)" not in ma.launch_list(tmp_path)
    # from the command line, beside the seed's table; alone it is refused (it lists a seed's launches)
    done = run_bench("--seed-table", str(tmp_path), "--launches")
    assert done.returncode == 0 and "## Every launch" in done.stdout and "06:47:59: 352 ms" in done.stdout
    refused = run_bench("--launches")
    assert refused.returncode == 2 and "--launches: only with --seed-table" in refused.stderr.strip().splitlines()[-1]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "holdout.json").write_text(json.dumps(plan))
    assert ma.launch_list(empty) == "no trials stored yet"


def test_the_repeated_profiles_spread_per_floor(tmp_path):
    from testbed.perfmodel.synthetic import synthetic_profile_dict

    for rep, scale in ((1, 1.0), (2, 1.2)):
        d = tmp_path / f"3hosts-rep{rep}"
        d.mkdir()
        prof = synthetic_profile_dict("resnet18", 16, forward_s=0.1 * scale, backward_s=0.2 * scale)
        name = next(iter(prof["compressors"]))
        prof["compressors"][name].update(lockstep_comm_s=0.05, lockstep_step_s=0.5 * (1.0 if rep == 1 else 1.5))
        (d / "resnet18-bs16-cpu-colocated3.json").write_text(json.dumps(prof))
    spread = ma.profile_spread_pct(tmp_path)
    assert spread["forward+backward"] == pytest.approx(0.2 / 2.2 * 100)  # (max - min) / (max + min)
    assert spread[name] == pytest.approx(0.25 / 1.25 * 100)
    assert ma.profile_spread_pct(tmp_path / "none") == {}  # no profiles: no spread, not a failure


def test_seed_table_of_a_folder_without_a_seed_is_refused(tmp_path):
    done = run_bench("--seed-table", str(tmp_path))
    assert done.returncode == 2 and "--seed-table" in done.stderr.strip().splitlines()[-1]


# bench/holdout_sitting.sh: a seed's progress lives in the repository between sittings (a session's machine is fresh)
SITTING = REPO / "bench" / "holdout_sitting.sh"


def sitting(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SITTING), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, named", [(["x1", "5"], "SEED 'x1'"), (["3", "0"], "MINUTES '0'"),
                                         (["3", "5m"], "MINUTES '5m'"), (["3", "5", "--dir", "rel"], "--dir 'rel'"),
                                         (["3", "5", "--bogus"], "'--bogus'"), (["3"], "expected SEED MINUTES"),
                                         (["424242", "5"], "has not started: give its bench arguments")])
def test_a_sittings_bad_input_is_one_line_and_exit_2(args, named, tmp_path):
    if "--dir" not in args and len(args) >= 2:
        args = [*args, "--dir", str(tmp_path / "d"), "--store", str(tmp_path / "s")]
    done = sitting(*args)
    assert done.returncode == 2 and named in done.stderr.strip(), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists() and not (tmp_path / "s").exists()


def test_a_started_seed_keeps_its_arguments(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "seed424242.tar.xz").write_bytes(b"")
    done = sitting("424242", "5", "--dir", str(tmp_path / "d"), "--store", str(tmp_path / "s"), "--", "--configs", "2")
    assert done.returncode == 2 and "has started" in done.stderr
    assert not (tmp_path / "d").exists()


def test_a_sitting_resumes_a_stored_seed_from_a_clone_at_its_commit_and_stores_it_back(tmp_path):
    """The round trip a session relies on: the archive is unpacked, the bench runs from a clone at the plan's commit
    (here every configuration is already finished, so it only scores them), the ledger line reaches --ledger, and the
    archive is written back."""
    import tarfile

    seed, args = 424242, ["--configs", "1", "--iters", "6", "--repeats", "2"]
    configs, _ = ma.draw_configs(seed, 1, lambda c: ma.why_infeasible(c, 6, 2, 5, 120, 0.0))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    work = tmp_path / "made" / f"seed{seed}"
    finished_config(work / "config1", "syncsgd,unshaped,compute,-2.0\ntopk,unshaped,floor,12.0\n", ["agrees"])
    (work / "holdout.json").write_text(json.dumps({"seed": seed, "configs": configs, "commit": head, "iters": 6,
                                                   "repeats": 2, "warmup_iters": 5, "min_measured_s": 0.0}))
    (work / "sitting-args").write_text("\n".join(args) + "\n")
    (tmp_path / "s").mkdir()
    with tarfile.open(tmp_path / "s" / f"seed{seed}.tar.xz", "w:xz") as tar:
        tar.add(work, arcname=f"seed{seed}")
    ledger = tmp_path / "ledger.jsonl"

    done = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(tmp_path / "s"), "--ledger",
                   str(ledger))
    assert done.returncode == 0, done.stderr
    clone = tmp_path / "d" / f"clone{seed}"
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip() == head
    line = json.loads(ledger.read_text())
    assert line["seed"] == seed and line["median_error_pct"] == 7.0 and line["worst_error_pct"] == 12.0
    with tarfile.open(tmp_path / "s" / f"seed{seed}.tar.xz") as tar:
        names = tar.getnames()
    assert f"seed{seed}/holdout.json" in names and f"seed{seed}/config1.md" not in names  # nothing to run: no log
    assert f"seed{seed}/config1/report/prediction_error.csv" in names
    assert not (REPO / "bench" / "holdout_runs" / f"seed{seed}.tar.xz").exists()
    # packed with a stamp, the folder's own: the next sitting here resumes from the folder
    stamp = (tmp_path / "d" / f"seed{seed}" / "packed").read_text()
    with tarfile.open(tmp_path / "s" / f"seed{seed}.tar.xz") as tar:
        assert tar.extractfile(f"seed{seed}/packed").read().decode() == stamp
    # an archive packed elsewhere (another machine's sitting, committed since) does not lose to the older folder here:
    # the sitting is refused, one line, and neither is touched
    elsewhere = tmp_path / "elsewhere" / f"seed{seed}"
    shutil.copytree(tmp_path / "d" / f"seed{seed}", elsewhere)
    (elsewhere / "packed").write_text("2026-12-06T10:00:00Z otherhost 1\n")
    with tarfile.open(tmp_path / "s" / f"seed{seed}.tar.xz", "w:xz") as tar:
        tar.add(elsewhere, arcname=f"seed{seed}")
    before = (tmp_path / "s" / f"seed{seed}.tar.xz").read_bytes()
    done = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(tmp_path / "s"), "--ledger",
                   str(ledger))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "otherhost" in done.stderr and "move" in done.stderr
    assert (tmp_path / "s" / f"seed{seed}.tar.xz").read_bytes() == before
    assert (tmp_path / "d" / f"seed{seed}" / "packed").read_text() == stamp


def _stand_in_clone(clone: Path, bench: str) -> str:
    """A git repository at `clone` whose bench/model_accuracy.py is `bench` (a frozen clone's stand-in): its commit."""
    (clone / "bench").mkdir(parents=True)
    (clone / "bench" / "model_accuracy.py").write_text(bench)
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t"]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "stand-in bench"]):
        subprocess.run([*git, *argv], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


# a stand-in for the frozen clone's bench: begins configuration 5 (its folder, as the bench makes it) and ends
_FAKE_BENCH = """import sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
(out / "config5" / "profiles").mkdir(parents=True)
print("configuration 5: running")
"""


def test_one_machine_per_configuration_an_unfinished_one_begun_elsewhere_is_set_aside_and_runs_again(tmp_path):
    """A configuration's calibrations, profiles and trials are compared with each other, so they come from one machine
    (seed 4's configuration 5, resumed on the next session's machine: 898 and 846 ms a profile launch there, 581 and
    582 here). The sitting sets aside an unfinished configuration begun on another machine, or on one it cannot
    name, with its log; resumes one begun on this machine; never touches a finished one; and stamps the
    configurations it begins with this machine. The bench is a stand-in, in a clone at the plan's commit."""
    import tarfile

    seed = 424243
    work, clone, store, ledger = (tmp_path / "d" / f"seed{seed}", tmp_path / "d" / f"clone{seed}", tmp_path / "s",
                                  tmp_path / "ledger.jsonl")  # fmt: skip
    commit = _stand_in_clone(clone, _FAKE_BENCH)
    work.mkdir(parents=True)
    (work / "holdout.json").write_text(json.dumps({"seed": seed, "commit": commit}))
    (work / "sitting-args").write_text("--configs\n4\n")
    finished_config(work / "config1", "syncsgd,unshaped,compute,-2.0\n", ["agrees"])  # finished, never stamped
    for n, stamp in ((2, "m-old"), (3, "m-here"), (4, None)):
        (work / f"config{n}" / "profiles").mkdir(parents=True)
        (work / f"config{n}.md").write_text(f"configuration {n}, an earlier sitting\n")
        if stamp:
            (work / f"config{n}" / "machine").write_text(stamp + "\n")

    done = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(store), "--ledger", str(ledger),
                   "--machine", "m-here")  # fmt: skip
    assert done.returncode == 0, done.stderr
    aside = {p.name.split("-")[0]: p for p in (work / "set-aside").iterdir() if p.is_dir()}
    assert sorted(aside) == ["config2", "config4"]
    assert (aside["config2"] / "machine").read_text() == "m-old\n" and (aside["config4"] / "profiles").is_dir()
    assert Path(f"{aside['config2']}.md").read_text() == "configuration 2, an earlier sitting\n"
    assert not (work / "config2").exists() and not (work / "config2.md").exists() and not (work / "config4").exists()
    assert "config2 was begun on m-old, not this one (m-here): set aside in" in done.stdout
    assert "config4 was begun on an unknown machine, not this one (m-here)" in done.stdout
    # resumed here, untouched, and begun here (stamped)
    assert (work / "config3" / "machine").read_text() == "m-here\n" and (work / "config3.md").is_file()
    assert not (work / "config1" / "machine").exists()
    assert (work / "config5" / "machine").read_text() == "m-here\n"
    with tarfile.open(store / f"seed{seed}.tar.xz") as tar:
        names = tar.getnames()
    assert f"seed{seed}/config5/machine" in names and f"seed{seed}/set-aside/{aside['config2'].name}/machine" in names
    # a --machine that is not an ID: one line, exit 2
    done = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(store), "--machine", "a b")
    assert done.returncode == 2 and "--machine 'a b'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# a stand-in for a frozen clone's bench whose plan estimates every configuration at 2 h: it begins configuration 1 (its
# folder and its log, as the bench makes them) and runs until SIGINT
_SLOW_BENCH = """import signal, sys
from pathlib import Path


def estimate_wall_s(cfg, iters, repeats, warmup, min_measured_s=0.0, relaunch_beyond_pct=None, max_launches=None):
    # a plan without a key: not passed (an older bench takes neither)
    return 7200.0 if relaunch_beyond_pct is None else 9000.0 if max_launches is None else 10800.0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    (out / "config1" / "profiles").mkdir(parents=True)
    (out / "config1.md").write_text("configuration 1, begun\\n")
    print("configuration 1: running", flush=True)
    while True:
        signal.pause()
"""


@pytest.mark.parametrize("again, minutes", [({}, 120), ({"relaunch_beyond_pct": 5.0}, 150),
                                            ({"relaunch_beyond_pct": 5.0, "max_launches": 4}, 180)])
def test_a_sitting_stops_at_a_configurations_start_when_it_would_not_finish_in_the_time_left(again, minutes, tmp_path):
    """A configuration cut off by a sitting's deadline is set aside by the next sitting (one machine per
    configuration), so its part is lost: a sitting stops before a configuration whose estimate, times --slack, is more
    than the minutes left, and removes the seconds of it that ran. Here 2 h (2.5 h with launches again) x 1.5 against
    5 minutes: stopped at once (were it not, the sitting would run to its 5-minute deadline and this test's 300 s
    timeout)."""
    seed = 424244
    work, clone, store = tmp_path / "d" / f"seed{seed}", tmp_path / "d" / f"clone{seed}", tmp_path / "s"
    commit = _stand_in_clone(clone, _SLOW_BENCH)
    work.mkdir(parents=True)
    (work / "holdout.json").write_text(json.dumps({"seed": seed, "commit": commit, "configs": [FAST], "iters": 6,
                                                   "repeats": 2, "warmup_iters": 5, "min_measured_s": 8.0, **again}))
    (work / "sitting-args").write_text("--configs\n1\n")
    done = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(store), "--ledger",
                   str(tmp_path / "ledger.jsonl"), "--machine", "m-here")  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the plan's estimate, with its launches again where the plan asks for them
    assert f"configuration 1 is estimated at {minutes} min (x150 %), and 4 min are left: stopping before it" in done.stdout
    assert "configuration 1: not begun in this sitting (removed)" in done.stdout
    assert not (work / "config1").exists() and not (work / "config1.md").exists()
    assert not (work / ".stopped-before").exists() and (store / f"seed{seed}.tar.xz").is_file()
    # --slack is a percentage: anything else is one line, exit 2
    bad = sitting(str(seed), "5", "--dir", str(tmp_path / "d"), "--store", str(store), "--slack", "1.5")
    assert bad.returncode == 2 and "--slack '1.5'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_fast_co_located_profile_is_launched_again_until_its_steps_last_the_time(tmp_path, monkeypatch):
    # seed 2, configuration 6: cnn bs16 on 4 ranks, one launch's 40 steps ~1 s by the estimate, its floors 5-8 %
    # apart from launch to launch
    cnn = {**FAST, "hosts": 4, "batch_size": 16}
    launches = ma.profile_launches(cnn, 6, 8.0)
    assert 2 < launches <= ma.MAX_PROFILE_LAUNCHES
    # together the launches' steps last the time asked for (or the cap is reached)
    assert launches * ma.profile_iters(cnn, 6, 8.0) * ma.step_s(cnn) >= 8.0 or launches == ma.MAX_PROFILE_LAUNCHES
    assert ma.profile_launches(FAST, 6, 8.0) == ma.MAX_PROFILE_LAUNCHES  # ~6 ms steps: capped
    # 40 steps of ~0.2 s already last 8 s: still launched twice (a launch is off by its own amount: seed 2,
    # configuration 7, 725 and 623 ms of forward + backward in two launches of one resnet18 repetition)
    assert ma.profile_launches(ISSUE, 6, 8.0) == ma.MIN_PROFILE_LAUNCHES == 2
    assert ma.profile_launches(cnn, 6, 0.0) == 1  # without --min-measured-s: one launch, as before
    # the estimate counts every launch: each one a profile's cost (at least its 60 s start), per repetition
    estimate = ma.estimate_wall_s(cnn, 6, 2, 5, 8.0)
    monkeypatch.setattr(ma, "profile_launches", lambda *_: 1)
    assert estimate - ma.estimate_wall_s(cnn, 6, 2, 5, 8.0) >= 2 * (launches - 1) * 60
    # the launches' folders: the first is a repetition's own (a single launch writes where it always did), the others
    # beside it, and the pooling's glob finds every one of them and no other repetition's or host count's
    dirs = ma.profile_dirs(tmp_path, 4, 2, 3)
    assert [d.name for d in dirs] == ["4hosts-rep2", "4hosts-rep2-launch2", "4hosts-rep2-launch3"]
    for d in [*dirs, tmp_path / "4hosts-rep1", tmp_path / "14hosts-rep2"]:
        d.mkdir()
    assert set(tmp_path.glob("4hosts-rep*")) == {*dirs, tmp_path / "4hosts-rep1"}
    # a round of launches again has a profile launch of its own, which the pooling's glob finds too
    ma.again_dir(tmp_path, 4, 1).mkdir()
    assert set(tmp_path.glob("4hosts-rep*")) == {*dirs, tmp_path / "4hosts-rep1", tmp_path / "4hosts-rep-again1"}


def order(launches: list, groups: list) -> str:
    return " ".join(f"P{launch}" if launch is not None else f"S{group}" for launch, group in ma.interleave(launches, groups))


def test_a_repetitions_profile_launches_are_spread_among_its_trials_first_before_last_after():
    """Seed 9, configuration 1: profiles launched only before the trials measured sync SGD's in-place step at the
    machine's upper level (1143-1203 ms) while most trials ran at the lower (954-1036 ms), +21 % on the unshaped step.
    The launches bracket the trials they predict; every launch and every grid runs once, grids in their order."""
    assert order([1, 2], [1, 2, 3]) == "P1 S1 S2 S3 P2"
    assert order([1, 2, 3], [1, 2, 3, 4]) == "P1 S1 S2 P2 S3 S4 P3"
    assert order([1], [1, 2]) == "P1 S1 S2"  # one launch (no --min-measured-s): before the trials, as it always was
    assert order([1, 2, 3, 4], [1]) == "P1 P2 S1 P3 P4"  # more launches than grids: as many before as after
    assert order([1, 2], []) == "P1 P2"
    for launches, groups in (([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3]), ([1, 2], list(range(1, 8)))):
        got = order(launches, groups).split()
        assert sorted(got) == sorted([f"P{j}" for j in launches] + [f"S{g}" for g in groups])
        assert [x for x in got if x[0] == "S"] == [f"S{g}" for g in groups] and got[0] == "P1" and got[-1][0] == "P"


# bench/rescore_seed.py: a finished seed's trials scored again (tuning data), on seed 2's own archive
RESCORE = REPO / "bench" / "rescore_seed.py"


def rescore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RESCORE), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_rescore_scores_a_stored_configuration_per_launch_subset(tmp_path):
    """Seed 2's configuration 8 (resnet18 bs32, 2 hosts): 16 settings; its stored score (the frozen model's, every
    launch pooled) is 3.5 % median and 8.8 % worst; each repetition's profile alone gives another score, and a glob
    that matches no launch says so."""
    import tarfile

    with tarfile.open(REPO / "bench" / "holdout_runs" / "seed2.tar.xz") as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name.startswith("seed2/config8")],
                       filter="data")  # fmt: skip
    seed = str(tmp_path / "seed2")
    done = rescore(seed, "--rows")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("config8:"))
    assert line.startswith("config8: 16 predictions, median |error| ")
    assert "syncsgd" in done.stdout and "mstopk" in done.stdout  # --rows: every setting
    assert "; with the trials' own compute: median " in line  # the error split off the profile's compute level
    assert "error_at_trial_compute_pct" in done.stdout and "predicted_backward_ms" not in done.stdout
    split = rescore(seed, "--split")  # every setting's backward and what follows it, measured and predicted
    assert split.returncode == 0, split.stderr
    header = next(x for x in split.stdout.splitlines() if "measured_backward_ms" in x).split()
    assert header[-4:] == ["measured_backward_ms", "predicted_backward_ms", "measured_after_backward_ms",
                           "predicted_after_backward_ms"]  # fmt: skip
    rows = [x.split() for x in split.stdout.splitlines() if x.split()[:2] == ["unshaped", "syncsgd"]]
    assert len(rows) == 1 and all(float(v) > 0 for v in rows[0][-4:-2])
    medians = set()
    for launches in ("*-rep1", "*-rep2"):
        one = rescore(seed, "--launches", launches)
        assert one.returncode == 0, one.stderr
        medians.add(next(x for x in one.stdout.splitlines() if x.startswith("config8:")))
    assert len(medians) == 2  # the two repetitions' profiles differ, and so do their scores
    without = rescore(seed, "--without", "mstopk,fp16", "--rows")  # seed 2's configuration 8: 4 rates, 4 compressors
    assert "config8: 8 predictions" in without.stdout and "mstopk" not in without.stdout, without.stdout
    none = rescore(seed, "--launches", "*-rep9")
    assert none.returncode == 0 and "config8: no profile launch matches '*-rep9'" in none.stdout


@pytest.mark.parametrize("args, named", [(["{d}", "--configs", "x"], "--configs 'x'"),
                                         (["{d}/nothing"], "no finished configuration")])
def test_rescore_bad_input_is_one_line_and_exit_2(args, named, tmp_path):
    done = rescore(*[a.format(d=tmp_path) for a in args])
    assert done.returncode == 2 and named in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# a child that, on SIGINT, says so and then undoes its work only when told (through a FIFO), as a calibration that is
# taking its shaping down; a later SIGINT it ignores
_CHILD = """
import pathlib, signal, sys
ready, stopping, go, undone = map(pathlib.Path, sys.argv[1:])
def stop(*_):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping.touch()
    go.read_text()
    undone.touch()
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
ready.touch()
while True:
    signal.pause()
"""
# the bench's entry point around one child, as `--holdout` runs a configuration. Started by timeout(1) or as a shell's
# foreground job it has Python's SIGINT handler; a suite started in the background (`make test &` in a script) hands
# its processes SIGINT ignored, so the handler is set here
_BENCH = """
import importlib.util, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
spec = importlib.util.spec_from_file_location("model_accuracy", sys.argv[1])
ma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ma)
sys.exit(ma.exit_on_ctrl_c(lambda: ma.run_through_ctrl_c([sys.executable, "-c", sys.argv[2], *sys.argv[3:]]).returncode))
"""


def _ignores_sigint(pid: int) -> bool:
    ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def test_a_sittings_deadline_waits_for_the_child_through_both_sigints_and_ends_in_one_line(tmp_path):
    """At a sitting's deadline `timeout -s INT` signals the bench and then its whole group. The bench must wait for
    its child to undo what it made, a second SIGINT must not cut that wait short, and it ends with one line and 130,
    not a traceback (seed 3's first sitting ended in one)."""
    ready, stopping, go, undone = (tmp_path / n for n in ("ready", "stopping", "go", "undone"))
    os.mkfifo(go)
    bench = subprocess.Popen([sys.executable, "-c", _BENCH, str(REPO / "bench" / "model_accuracy.py"), _CHILD,
                              str(ready), str(stopping), str(go), str(undone)],
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: ready.exists() or bench.poll() is not None, 60, "the child to start")
        assert bench.poll() is None, bench.communicate()[1]
        os.killpg(bench.pid, signal.SIGINT)
        wait_for(lambda: stopping.exists() and _ignores_sigint(bench.pid), 60, "the bench to wait for the child")
        os.killpg(bench.pid, signal.SIGINT)  # the second one, while the child is still undoing its work
        go.write_text("go")
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert undone.exists()  # the bench ended after its child had finished undoing
    assert bench.returncode == 130
    assert err.strip().splitlines() == [err.strip()] and err.startswith("interrupted (SIGINT)") and "resumes" in err


def test_a_calibration_cut_off_between_rates_resumes_with_the_rates_it_did_not_store(tmp_path, monkeypatch):
    """`testbed calibrate` stores each rate as it finishes; a sitting cut off at its third of four rates used to take
    all four again (seed 4: about 10 minutes). The next one measures only the rates missing, and the set it returns is in
    --calibrate-bw's order, as one calibrate command gives it."""
    from testbed import perfmodel as pm
    from unit.testbed.perfmodel.test_calibration import synthetic_bench

    def stored(hosts: int, rate_bps: int | None, cluster: str = ma.NAME, cross_traffic: int = 0) -> dict:
        c = pm.calibration_from_bench(synthetic_bench(hosts, 80e-6, 0.9e9, 0.6e9, 1e-9, 0.0), cluster=cluster,
                                      rate_bps=rate_bps, cross_traffic=cross_traffic)  # fmt: skip
        path = pm.save_calibration(c, tmp_path)
        return {"path": str(path), **pm.calibration_to_dict(c)}

    mbit200, unshaped = stored(3, 200 * 10**6), stored(3, None)
    stored(2, 10**9)  # another world size,
    stored(3, 10**9, cross_traffic=2)  # one beside cross traffic,
    stored(3, 10**9, cluster="other")  # and another cluster's: none of them is this configuration's 1 Gbit/s
    (tmp_path / "calibration-broken.json").write_text("{")
    measured = stored(3, 10**9, cluster="fresh")
    asked = []

    def testbed(*argv, timeout_s=0):
        asked.append(argv)
        return json.dumps(measured)  # one rate: calibrate --json prints the object, not a list

    monkeypatch.setattr(ma, "testbed", testbed)
    rates = ["none", "1gbit", "200mbit"]
    assert ma.calibrate(3, rates, "1MB,4MB", tmp_path) == [unshaped, measured, mbit200]
    assert asked == [("calibrate", "--name", ma.NAME, "--bw", "1gbit", "--sizes", "1MB,4MB", "--out", str(tmp_path),
                      "--json")]  # fmt: skip
    asked.clear()
    assert ma.calibrate(3, ["200mbit", "none"], "1MB", tmp_path) == [mbit200, unshaped]
    assert asked == []  # every rate stored: nothing measured
