"""Report: synthetic results frames in, PNGs / self-contained HTML / Markdown headline out; bad input is clear."""

import json
import re

import pandas as pd
import pytest

from testbed import perfmodel as pm
from testbed.errors import InputError
from testbed.report import build_report, measured_crossover, report_from_dir
from testbed.report.analysis import crossover_verdict, decided_bracket, tie_flags, welch_p
from testbed.results import COLUMNS as RESULTS_COLUMNS

pytestmark = pytest.mark.xdist_group("test_report")  # the module's report is drawn once, on one xdist worker

COLUMNS = list(RESULTS_COLUMNS)  # the results store's own columns: a frame as `testbed results` loads it


def row(i, model, ws, rate, comp, t, status="ok", options="{}"):
    return {
        "schema_version": 1,
        "trial_id": f"t{i:04d}",
        "status": status,
        "error": None if status == "ok" else "boom",
        "started_at": "2026-11-30T05:00:00+00:00",
        "wall_s": 10.0,
        "backend": "local",
        "cluster_name": "tb",
        "host_count": ws,
        "world_size": ws,
        "rate_bps": rate,
        "burst_bytes": 125000,
        "qdisc": "htb",
        "delay_s": 0.0,
        "measured_goodput_bps": rate * 0.95 if rate else 7e9,
        "ideal_goodput_bps": rate * 0.956,
        "model": model,
        "batch_size": 32,
        "image_size": 64,
        "seq_len": None,
        "compressor": comp,
        "compressor_options": options,
        "iters": 20,
        "warmup_iters": 3,
        "seed": 0,
        "serial": False,
        "bucket_cap_mb": 25.0,
        "torch_version": "2.14.1",
        "python_version": "3.11",
        "kernel": "6.1",
        "dist_backend": "gloo",
        "device": "cpu",
        "testbed_version": "0.1.0",
        "hostname": "h",
        "iter_time_s_mean": t,
        "iter_time_s_p5": t * 0.9,
        "iter_time_s_p50": t,
        "iter_time_s_p95": t * 1.2,
        "samples_per_s": ws * 32 / t if status == "ok" else None,
        "forward_s": 0.03,
        "backward_s": 0.06,
        "encode_s": 0.01,
        "comm_s": max(t - 0.1, 0.0),
        "decode_s": 0.005,
        "optimizer_s": 0.005,
        "payload_bytes_per_iter": 1000,
        "wire_tx_bytes_per_iter": 1100,
        "wire_rx_bytes_per_iter": 1100,
    }


# Measured times (s) per (world size, rate): syncsgd, fp16, powersgd. Designed so the counts are known:
# vs syncsgd, fp16 wins at 10M/100M (4 cfgs: 2 ws), powersgd wins at 10M/100M; both lose at 1G.
TIMES = {
    10_000_000: (40.0, 20.0, 0.5),
    100_000_000: (4.0, 2.0, 0.2),
    1_000_000_000: (0.2, 0.25, 0.3),
}


def synthetic_frame(world_sizes=(2, 4), model="resnet18"):
    rows, i = [], 0
    for ws in world_sizes:
        for rate, times in TIMES.items():
            for comp, t in zip(("syncsgd", "fp16", "powersgd"), times, strict=True):
                rows.append(
                    row(
                        i,
                        model,
                        ws,
                        rate,
                        comp,
                        t * (1 + 0.1 * (ws - 2)),
                        options='{"rank": 4}' if comp == "powersgd" else "{}",
                    )
                )
                i += 1
    rows.append(row(i, model, world_sizes[0], 10_000_000, "topk", 1.0, status="failed"))
    return pd.DataFrame(rows, columns=COLUMNS)


def write_store(path, df):
    """Store a frame the way `testbed run` does: one Parquet row per trial through the results store."""
    from testbed.results import ResultsStore

    store = ResultsStore(path)
    for rec in df.to_dict("records"):
        store.append({k: (None if isinstance(v, float) and v != v else v) for k, v in rec.items()})
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    return build_report(synthetic_frame(), out, profiles=[prof])


def test_report_writes_figures_html_markdown(report):
    names = sorted(p.name for p in report.figures)
    assert names == sorted(
        [
            "time_vs_bw_resnet18_bs32_p2.png",
            "time_vs_bw_resnet18_bs32_p4.png",
            "phases_resnet18_bs32_p2.png",
            "phases_resnet18_bs32_p4.png",
            "scaling_resnet18_bs32.png",
        ]
    )
    for p in report.figures:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    html = report.html.read_text()
    assert html.count("src='data:image/png;base64,") == len(report.figures)
    assert "://" not in html  # self-contained: no external URL of any kind
    assert not re.search(r"""(src|href)\s*=\s*['"](?!data:)""", html)


def test_a_markdown_section_becomes_html_with_its_tables_and_raw_html_escaped():
    from testbed.report.render import section_html

    out = section_html("\n## Racks\n\n| model | ms |\n|---|---|\n| <script>x</script> | 12 |\n")
    assert "<h2>Racks</h2>" in out and "<table>" in out and "<td>12</td>" in out
    assert "<script>" not in out and "&lt;script&gt;" in out  # a name from the results is text, never markup


def test_headline_counts_n_of_m(report):
    # 2 world sizes x 3 rates x 2 compressors (fp16, powersgd[rank=4]) = 12 configurations; wins at 2 rates each
    assert (report.wins, report.configurations) == (8, 12)
    md = report.markdown.read_text()
    assert "Compression beat fp32 sync SGD (syncsgd) in 8 of 12 configurations" in md
    assert "1 failed" in md and "18 ok" in md
    assert "powersgd[rank=4]" in md


def test_speedup_matrix_and_crossovers(report):
    m = report.tables["speedups"]
    r = m[(m["world_size"] == 2) & (m["bandwidth"] == "10mbit")].iloc[0]
    assert r["fp16"] == "2.00x" and r["powersgd[rank=4]"] == "80.00x" and r["syncsgd"] == "1.00x"
    cx = report.tables["crossovers"]
    p2 = cx[(cx["world_size"] == 2) & (cx["compressor"] == "fp16")].iloc[0]
    # fp16 speedup 2.0 at 100M, 0.8 at 1G: log-interpolated crossing between them
    assert 1e8 < p2["measured_bps"] < 1e9
    assert p2["predicted"] != "no profile"


def test_prediction_error_table_covers_ok_trials(report):
    err = report.tables["errors"]
    assert len(err) == 18  # every ok configuration; the failed one is not predicted
    assert set(err["compressor"]) == {"syncsgd", "fp16", "powersgd[rank=4]"}
    assert err["predicted_ms"].gt(0).all()
    assert err["trials"].eq(1).all()


def test_prediction_error_pools_repeated_trials_by_their_median(tmp_path):
    df = synthetic_frame(world_sizes=(2,))
    ok = df[df["status"] == "ok"]
    repeats = [ok.assign(trial_id=ok["trial_id"] + suffix, iter_time_s_p50=ok["iter_time_s_p50"] * k)
               for suffix, k in (("a", 1.0), ("b", 1.1), ("c", 3.0))]  # fmt: skip
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    err = build_report(pd.concat(repeats), tmp_path, profiles=[prof]).tables["errors"]
    assert len(err) == 9 and err["trials"].eq(3).all()  # one row per configuration, not per trial
    single = build_report(repeats[1], tmp_path / "one", profiles=[prof]).tables["errors"]
    # the median repeat (x1.1) is what the prediction is held against; the disturbed x3 one does not move it
    assert err["measured_ms"].tolist() == pytest.approx(single["measured_ms"].tolist())
    assert err["predicted_ms"].tolist() == pytest.approx(single["predicted_ms"].tolist())


def test_prediction_error_splits_off_the_trials_own_compute(tmp_path):
    """Each row holds the trials' forward + backward + optimizer beside the profile's, and the error the prediction
    would have had with the trials' compute: moving the trials' compute by d moves that error by d over the measured
    time and leaves the prediction's own error where it was; trials without phases give nan, not a crash."""
    df = synthetic_frame(world_sizes=(2,))
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    err = build_report(df, tmp_path / "a", profiles=[prof]).tables["errors"]
    assert err["measured_compute_ms"].tolist() == pytest.approx([95.0] * len(err))  # 30 + 60 + 5 ms, every row
    profile_ms = (prof.forward_s + prof.backward_s + prof.optimizer_s) * 1e3
    assert err["profile_compute_ms"].tolist() == pytest.approx([profile_ms] * len(err))
    slower = build_report(df.assign(backward_s=df["backward_s"] + 0.02), tmp_path / "b", profiles=[prof]).tables["errors"]
    assert slower["error_pct"].tolist() == pytest.approx(err["error_pct"].tolist())
    moved = slower["error_at_trial_compute_pct"] - err["error_at_trial_compute_pct"]
    assert moved.tolist() == pytest.approx((20.0 / err["measured_ms"] * 100).tolist())
    same = err["error_at_trial_compute_pct"] - err["error_pct"]
    assert same.tolist() == pytest.approx(((95.0 - profile_ms) / err["measured_ms"] * 100).tolist())
    bare = build_report(df.assign(forward_s=None), tmp_path / "c", profiles=[prof]).tables["errors"]
    assert bare["measured_compute_ms"].isna().all() and bare["error_at_trial_compute_pct"].isna().all()
    assert bare["error_pct"].notna().all()
    # the backward phase split at the end of its compute: the trials' backward with its encodes (60 + 10 ms) and
    # what came after it (their waits and decodes); the composition's, which with forward and optimizer (and without
    # a floor deciding) adds up to the prediction
    assert err["measured_backward_ms"].tolist() == pytest.approx([70.0] * len(err))
    moved = slower["measured_backward_ms"] - err["measured_backward_ms"]
    assert moved.tolist() == pytest.approx([20.0] * len(err))
    assert err["measured_after_backward_ms"].tolist() == pytest.approx(
        ((err["measured_ms"] / 1e3 - 0.1).clip(lower=0) * 1e3 + 5.0).tolist(), abs=0.2)  # the rows' comm + decode
    assert (err["predicted_backward_ms"] >= prof.backward_s * 1e3 - 1e-6).all()
    rebuilt = (prof.forward_s + prof.optimizer_s) * 1e3 + err["predicted_backward_ms"] + err["predicted_after_backward_ms"]
    assert rebuilt.tolist() == pytest.approx(err["predicted_ms"].tolist())
    assert (err["predicted_after_backward_ms"] > 1.0).any()  # the slow rates wait for their collectives after backward


def test_sixteen_bit_baseline_excludes_dense(tmp_path):
    res = build_report(synthetic_frame(world_sizes=(2,)), tmp_path, baseline="fp16")
    # only powersgd counts against fp16: 3 rates; it wins at 10M (40x) and 100M (10x), loses at 1G
    assert (res.wins, res.configurations) == (2, 3)
    assert "the 16-bit all-reduce baseline (fp16) in 2 of 3" in res.headline
    assert any("no profile found" in n for n in res.notes)


def test_group_without_baseline_is_noted_not_crashing(tmp_path):
    df = synthetic_frame(world_sizes=(2,))
    df = df[df["compressor"] != "syncsgd"]
    res = build_report(df, tmp_path)
    assert res.configurations == 0
    assert any("no ok syncsgd trials; reported without speedups" in n for n in res.notes)
    assert "in 0 of 0 configurations" in res.markdown.read_text()


def test_measured_crossover_kinds():
    assert measured_crossover([1e7, 1e8], [2.0, 1.5]) == ("always", None)
    assert measured_crossover([1e7, 1e8], [0.5, 0.9]) == ("never", None)
    kind, b = measured_crossover([1e7, 1e9], [10.0, 0.1])
    assert kind == "crossover" and b == pytest.approx(1e8)
    assert measured_crossover([1e7], [2.0])[0] == "n/a"


def test_ties_in_the_measured_crossover():
    # a noise-decided crossing (every rate a tie) is not a crossover
    assert measured_crossover([1e8, 1e9, 1e10], [1.05, 0.97, 1.02], [True, True, True]) == ("tie", None)
    # the medians cross only among tied rates beyond the last decided one: the decided answer stands
    assert measured_crossover([1e8, 1e9, 1e10], [2.0, 0.97, 1.02], [False, True, True]) == ("always", None)
    # decided rates on both sides: the medians place it (at the tied 1e8), the decided rates bracket it
    rates, speedups, ties = [1e7, 1e8, 1e9], [10.0, 1.02, 0.1], [False, True, False]
    kind, b = measured_crossover(rates, speedups, ties)
    assert kind == "crossover" and b == pytest.approx(1e8, rel=0.05)
    assert decided_bracket(rates, speedups, ties, b) == (1e7, 1e9)
    assert decided_bracket(rates, speedups, [False] * 3, b) == (1e8, 1e9)  # no ties: the adjacent rates
    assert measured_crossover([1e7], [2.0], [True])[0] == "n/a"


def test_verdict_with_ties_holds_the_model_only_to_the_decided_rates():
    # measured 1.84 Gbit from medians, decided at 500 Mbit (faster) and 5 Gbit (slower), 1 Gbit tied between
    ratio, verdict = crossover_verdict("crossover", 1.84e9, "crossover", 0.86e9, 1e8, 1e10, tied_bracket=(5e8, 5e9))
    assert verdict.startswith("agrees: between the decided rates 500mbit and 5gbit") and ratio == pytest.approx(0.467, rel=0.01)
    assert crossover_verdict("crossover", 1.84e9, "crossover", 0.4e9, 1e8, 1e10, tied_bracket=(5e8, 5e9))[
        1
    ].startswith("disagrees")
    # always faster at the decided 100 Mbit..1 Gbit, tied at 5 Gbit and above: a model crossing at 3 Gbit agrees,
    # one at 700 Mbit (slower at the decided 1 Gbit) does not
    decided = [1e8, 5e8, 1e9]
    assert crossover_verdict("always", None, "crossover", 3e9, 1e8, 1e10, decided_bps=decided)[1].startswith(
        "agrees: never among the decided rates (always faster), model crosses at 3gbit"
    )
    assert crossover_verdict("always", None, "crossover", 7e8, 1e8, 1e10, decided_bps=decided)[1].startswith(
        "disagrees: never in the measured range"
    )


def test_ties_are_tested_over_the_whole_curve():
    same, fast = (1.0, 1.1, 1.2), (0.50, 0.52, 0.55)
    assert tie_flags([(fast, same)] * 4) == [False] * 4  # 2x apart at every rate: every rate decided
    assert tie_flags([(same, same)] * 4) == [True] * 4
    # 4 % apart with a few per cent of spread: decided by Welch's test at one rate (p < 0.05) ...
    near = ((1.04, 1.05, 1.06), (1.0, 1.01, 1.02))
    assert welch_p(*near) < 0.05
    # ... but not with 5 other rates in the family, where the smallest p must beat 0.05 / 6 (Holm); ranges that
    # merely miss each other (the old rule) are what 1 curve in 2 shows by chance with 3 repeats and 6 rates
    loose = ((1.06, 1.10, 1.14), (0.98, 1.0, 1.04))
    assert 0.05 / 6 < welch_p(*loose) < 0.05
    assert tie_flags([loose, *[(same, same)] * 5])[0] is True
    assert tie_flags([near, *[(fast, same)] * 5]) == [False] * 6  # Holm steps down: the strong ones free it
    # one trial of either: its spread is unknown, nothing is called a tie, and it takes no part in the family
    assert tie_flags([((1.0,), same), (same, same)]) == [False, True]
    assert tie_flags([((1.0, 1.0), (1.0, 1.0)), ((1.0, 1.0), (2.0, 2.0))]) == [True, False]  # no spread at all


def test_report_calls_a_crossing_inside_the_repeats_spread_a_tie(tmp_path):
    """fp16 measured 1.0 +- 10 % of syncsgd at every rate over three repeats: the crossing the medians show is
    within the spread, and the verdict says so instead of holding the model against it."""
    rows, i = [], 0
    for rate, sign in ((100_000_000, -1), (1_000_000_000, 1)):
        for rep, k in enumerate((0.9, 1.0, 1.1)):
            for comp, t in (("syncsgd", 0.4 * k), ("fp16", 0.4 * (1 + sign * 0.02) * k)):
                rows.append(row(i, "resnet18", 2, rate, comp, t) | {"seed": rep})
                i += 1
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    res = build_report(pd.DataFrame(rows, columns=COLUMNS), tmp_path, profiles=[prof])
    fp16 = res.tables["crossovers"].iloc[0]
    assert fp16["measured"] == "tie at every rate" and pd.isna(fp16["measured_bps"])
    assert fp16["verdict"].startswith("undecided: a tie at every measured rate")
    # the headline counts only decided wins, the matrix marks the ties
    assert res.headline.startswith("Compression beat fp32 sync SGD (syncsgd) in 0 of 2 configurations; 2 are ties")
    matrix = res.tables["speedups"]
    assert matrix["fp16"].str.startswith("~").all() and matrix["syncsgd"].eq("1.00x").all()
    # the same medians from one trial each: no spread known, so the crossing counts (and is held against the model)
    one = build_report(pd.DataFrame(rows[2:4] + rows[8:10], columns=COLUMNS), tmp_path / "one", profiles=[prof])
    fp16 = one.tables["crossovers"].iloc[0]
    assert 1e8 < fp16["measured_bps"] < 1e9 and not fp16["verdict"].startswith("undecided")
    assert any(n.startswith("every setting ran once") for n in one.notes)
    assert not any(n.startswith("every setting ran once") for n in res.notes)


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="no trials found"):
        build_report(pd.DataFrame(columns=COLUMNS), tmp_path)
    with pytest.raises(InputError, match="missing column"):
        build_report(synthetic_frame().drop(columns=["iter_time_s_p50"]), tmp_path)
    df = synthetic_frame()
    with pytest.raises(InputError, match="no trial with status ok"):
        build_report(df.assign(status="failed"), tmp_path)
    with pytest.raises(InputError, match="schema_version 99 is not supported"):
        build_report(df.assign(schema_version=99), tmp_path)
    with pytest.raises(InputError, match="expected one of syncsgd, fp16, bf16"):
        build_report(df, tmp_path, baseline="topk")
    with pytest.raises(InputError, match="does not exist"):
        report_from_dir(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no trials"):
        report_from_dir(tmp_path / "empty", tmp_path / "out")


def test_trials_whose_measurement_warned_are_counted_in_a_note(tmp_path):
    df = synthetic_frame(world_sizes=(2,))
    first = df.index[0]
    df.loc[first, ["settle_ratio", "warmup_iters"]] = [1.5, 2]  # still warming up when measured
    res = build_report(df, tmp_path)
    warned = [n for n in res.notes if n.startswith("trials whose measurement warned")]
    assert len(warned) == 1 and f"1 still warming up ({df.loc[first, 'trial_id']})" in warned[0]
    assert not any(n.startswith("trials whose measurement warned") for n in build_report(
        synthetic_frame(world_sizes=(2,)), tmp_path / "steady").notes)  # fmt: skip


def test_mixed_schema_versions_are_noted(tmp_path):
    df = synthetic_frame(world_sizes=(2,))
    df.loc[df.index[:3], "schema_version"] = 99  # a future store's rows: skipped and said; 1 to 6 read
    res = build_report(df, tmp_path)
    assert any("schema_version 99 skipped" in n and "3 trial(s)" in n for n in res.notes)


def test_report_from_parquet_dir_with_profiles(tmp_path):
    results = write_store(tmp_path / "results", synthetic_frame(world_sizes=(2,)))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "resnet18-bs32-cpu.json").write_text(json.dumps(pm.synthetic_profile_dict("resnet18", 32)))
    res = report_from_dir(results, tmp_path / "out", profiles_dir=profiles)
    assert res.html.exists() and (tmp_path / "out" / "speedups.csv").exists()
    assert "profiles used: resnet18 bs32 (cpu)" in res.markdown.read_text()
    assert len(res.tables["errors"]) == 9


def test_efficiency_auto_recovers_a_known_efficiency(tmp_path):
    # measured syncsgd times generated by the model itself at efficiency 0.6: the fit must find 0.6
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32))
    df = synthetic_frame(world_sizes=(2,))
    for i in df.index[df["compressor"] == "syncsgd"]:
        t = pm.predict_iteration(prof, "syncsgd", pm.Network(2, df.at[i, "rate_bps"], 50e-6, 0.6)).iter_time_s
        df.loc[i, ["iter_time_s_p50", "iter_time_s_mean"]] = t
    res = build_report(df, tmp_path, profiles=[prof], efficiency="auto")
    note = next(n for n in res.notes if n.startswith("efficiency fitted"))
    assert float(note.rsplit(" ", 1)[1]) == pytest.approx(0.6, abs=0.01)
    err = res.tables["errors"]
    assert err.loc[err["compressor"] == "syncsgd", "error_pct"].abs().max() < 1.0
    with pytest.raises(InputError, match="'auto'"):
        build_report(df, tmp_path, efficiency="fast")


def test_single_worker_trials_are_not_counted_as_configurations(tmp_path):
    df = synthetic_frame(world_sizes=(1, 2))
    res = build_report(df, tmp_path)
    assert (res.wins, res.configurations) == (4, 6)  # only the 2-worker configurations count
    assert any(p.name == "scaling_resnet18_bs32.png" for p in res.figures)


def test_serial_trials_are_their_own_variant_and_predicted_without_overlap(tmp_path):
    df = synthetic_frame(world_sizes=(2,))
    serial = df[df["compressor"] == "powersgd"].copy()
    serial["serial"] = True
    serial["trial_id"] = serial["trial_id"] + "s"
    serial["iter_time_s_p50"] = serial["iter_time_s_p50"] * 2
    prof = pm.profile_from_dict(pm.synthetic_profile_dict(model="resnet18", batch_size=32, n_buckets=4))
    res = build_report(pd.concat([df, serial], ignore_index=True), tmp_path, profiles=[prof])
    m = res.tables["speedups"]
    assert "powersgd[rank=4] serial" in m.columns
    assert m.loc[m["bandwidth"] == "10mbit", "powersgd[rank=4] serial"].iloc[0] == "40.00x"  # not pooled
    err = res.tables["errors"].set_index("trial_id")
    net = pm.Network(2, 1e9, 50e-6)
    # the report models blocking hooks by default (perfmodel's own default is now overlapped)
    expect = pm.predict_iteration(pm.serialized(prof), "powersgd", net, hook_blocks_backward=True).iter_time_s * 1e3
    sid = serial.loc[serial["rate_bps"] == 1_000_000_000, "trial_id"].iloc[0]
    assert err.loc[sid, "predicted_ms"] == pytest.approx(expect)
    assert (
        pm.predict_iteration(pm.serialized(prof), "syncsgd", net).iter_time_s
        > pm.predict_iteration(prof, "syncsgd", net).iter_time_s
    )


def test_report_names_its_calibration_and_gives_crossover_verdicts(tmp_path):
    from unit.testbed.perfmodel.test_calibration import synthetic_bench


    prof = pm.profile_from_dict(pm.synthetic_profile_dict("resnet18", 32))
    c = pm.calibration_from_bench(synthetic_bench(4, 80e-6, 0.9e9, 0.9e9, 1e-9, 0.0), cluster="lab", rate_bps=10**9)
    res = build_report(synthetic_frame(), tmp_path / "with", profiles=[prof], calibrations=[c])
    md = (tmp_path / "with" / "summary.md").read_text()
    assert "calibration cluster lab" in md and "host cost 1 ns/B" in md
    cx = res.tables["crossovers"]
    assert {"predicted/measured", "verdict"} <= set(cx.columns)
    assert cx["verdict"].str.match(r"^(agrees|disagrees|n/a|no prediction)").all()
    assert "verdict" in md
    res = build_report(synthetic_frame(), tmp_path / "without", profiles=[prof])
    assert "defaults (no calibration" in (tmp_path / "without" / "summary.md").read_text()
