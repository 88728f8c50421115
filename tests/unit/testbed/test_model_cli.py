"""`testbed profile/predict/report` handlers, driven through a tiny argparse like cli.py's."""

import argparse
import json
import sys
import types

import pytest

from testbed import model_cli
from testbed import perfmodel as pm
from testbed.errors import InputError


def run(argv):
    parser = argparse.ArgumentParser(prog="testbed")
    model_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "resnet18-bs32-cpu.json"
    path.write_text(json.dumps(pm.synthetic_profile_dict("resnet18", 32)))
    return path


@pytest.fixture
def fake_profiler(monkeypatch):
    """Stands in for runners.profile.profile_model; records its calls."""
    calls = []

    def profile_model(
        model,
        batch_size,
        compressors,
        *,
        image_size=None,
        seq_len=None,
        iters=10,
        bucket_cap_mb=25,
        options=None,
        device="cpu",
    ):
        calls.append(
            {
                "model": model,
                "batch_size": batch_size,
                "compressors": list(compressors),
                "iters": iters,
                "device": device,
            }
        )
        return pm.synthetic_profile_dict(model, batch_size)

    monkeypatch.setitem(sys.modules, "runners.profile", types.SimpleNamespace(profile_model=profile_model))
    return calls


def test_predict_json_matches_model(profile_file, capsys):
    assert (
        run(
            [
                "predict",
                "--profile",
                str(profile_file),
                "--world-size",
                "4",
                "--bw",
                "10mbit..10gbit",
                "--points",
                "5",
                "--latency",
                "50us",
                "--efficiency",
                "0.9",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["bandwidths_bps"] == pytest.approx([1e7, 10**7.75, 10**8.5, 10**9.25, 1e10])
    assert data["latency_s"] == pytest.approx(50e-6) and data["efficiency"] == 0.9
    prof = pm.load_profile(profile_file)
    # the CLI models blocking hooks unless --overlap-hooks (perfmodel's own default is now overlapped)
    expect = pm.predict_iteration(prof, "powersgd", pm.Network(4, 1e7, 50e-6, 0.9), hook_blocks_backward=True)
    expect = expect.iter_time_s
    assert data["compressors"]["powersgd"]["iter_time_s"][0] == pytest.approx(expect)
    # no co-located floor in this profile: the composition is the prediction
    powersgd = data["compressors"]["powersgd"]
    assert powersgd["composed_s"] == pytest.approx(powersgd["iter_time_s"])
    assert data["compressors"]["syncsgd"]["crossover"] is None  # the baseline has no crossover with itself
    assert data["compressors"]["fp16"]["speedup"][0] == pytest.approx(2.0, rel=0.01)
    assert set(data["compressors"]) == set(pm.COMPRESSORS)


def test_predict_table_output(profile_file, capsys):
    assert run(["predict", "--profile", str(profile_file), "--bw", "100mbit..100gbit", "--points", "4"]) == 0
    out = capsys.readouterr().out
    assert "predicted iteration time (ms)" in out and "crossover B*" in out
    assert "powersgd" in out and "100gbit" in out and "(baseline)" in out
    assert "faster below" in out  # the synthetic profile crosses over inside 100mbit..100gbit


def test_compute_speedup_raises_crossover(profile_file, capsys):
    def b_star(extra):
        run(
            [
                "predict",
                "--profile",
                str(profile_file),
                "--bw",
                "100mbit..400gbit",
                "--points",
                "9",
                "--compressors",
                "powersgd",
                "--json",
                *extra,
            ]
        )
        return json.loads(capsys.readouterr().out)["compressors"]["powersgd"]["crossover"]["bandwidth_bps"]

    base = b_star([])
    assert b_star(["--compute-speedup", "4"]) > base
    assert b_star(["--codec-speedup", "4"]) > base


def test_predict_measures_when_no_profile_stored_then_reuses(tmp_path, fake_profiler, capsys):
    profiles = tmp_path / "profiles"
    argv = ["predict", "--model", "mlp", "--batch-size", "16", "--profiles", str(profiles), "--bw", "1gbit", "--json"]
    assert run(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(fake_profiler) == 1 and fake_profiler[0]["model"] == "mlp"
    stored = profiles / "mlp-bs16-cpu.json"
    assert stored.is_file() and "measured now" in first["profile"]
    assert run(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert len(fake_profiler) == 1  # reused, not measured again
    assert second["profile"] == str(stored)
    assert second["compressors"]["topk"]["iter_time_s"] == first["compressors"]["topk"]["iter_time_s"]


def test_profile_command_stores_json_and_prints_table(tmp_path, fake_profiler, capsys):
    out = tmp_path / "p"
    assert (
        run(
            [
                "profile",
                "--model",
                "resnet18",
                "--batch-size",
                "8",
                "--compressors",
                "powersgd,topk",
                "--iters",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert fake_profiler[0]["compressors"] == ["powersgd", "topk"] and fake_profiler[0]["iters"] == 3
    assert pm.load_profile(out / "resnet18-bs8-cpu.json").batch_size == 8
    assert "payload MB" in text and "powersgd" in text and "stored:" in text


def test_report_command(tmp_path, profile_file, capsys):
    from unit.testbed.report.test_report import synthetic_frame, write_store

    results = write_store(tmp_path / "results", synthetic_frame(world_sizes=(2,)))
    assert (
        run(
            [
                "report",
                str(results),
                "--out",
                str(tmp_path / "rep"),
                "--profiles",
                str(profile_file.parent),
                "--baseline",
                "fp16",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["headline"].startswith("Compression beat the 16-bit all-reduce baseline (fp16) in 2 of 3")
    assert (tmp_path / "rep" / "report.html").is_file() and len(data["figures"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["predict", "--bw", "10gbit..10mbit"], "from low to high"),
        (["predict", "--bw", "9gbps"], "ambiguous unit"),
        (["predict", "--bw", "10mbit..1gbit", "--points", "1"], "at least 2 points"),
        (["predict", "--efficiency", "1.5"], r"in \(0, 1\]"),
        (["predict", "--compute-speedup", "0"], "positive number"),
        (["predict", "--compressors", "zip"], "expected names from syncsgd"),
        (["predict", "--latency", "5 parsecs"], "--latency"),
        (["predict"], "needs --model NAME"),
        (["predict", "--profile", "/nonexistent/p.json"], "no such file"),
        (["predict", "--profile", "/"], "a directory, not a file"),
        (["predict", "--calibration", "/"], "a directory, not a file"),
        (["report", "/nonexistent/results"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_input_error(argv, message):
    with pytest.raises(InputError, match=message) as exc:
        run(argv)
    assert "\n" not in str(exc.value)


def test_predict_rejects_compressor_missing_from_profile(tmp_path):
    d = pm.synthetic_profile_dict("m", 8, codecs={"powersgd": pm.SYNTHETIC_CODECS["powersgd"]})
    (tmp_path / "m.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match="topk not in profile"):
        run(["predict", "--profile", str(tmp_path / "m.json"), "--compressors", "topk"])


def test_predict_uses_a_calibration_and_says_which(tmp_path, profile_file, capsys):
    from unit.testbed.perfmodel.test_calibration import synthetic_bench


    c = pm.calibration_from_bench(synthetic_bench(4, 200e-6, 0.8e9, 0.5e9, 2e-9, 1e-9), cluster="lab", rate_bps=10**9)
    (tmp_path / "profiles").mkdir()
    path = tmp_path / "profiles" / pm.calibration_filename("lab", "gloo", 4, 10**9)
    path.write_text(json.dumps(pm.calibration_to_dict(c)))
    argv = ["predict", "--profile", str(profile_file), "--world-size", "4", "--bw", "10gbit", "--json"]
    assert run([*argv, "--profiles", str(tmp_path / "profiles")]) == 0  # auto: the stored one
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"].startswith("calibration " + path.name)
    assert data["latency_s"] == pytest.approx(200e-6) and data["efficiency"] == pytest.approx(0.8)
    assert data["allgather_efficiency"] == pytest.approx(0.5)
    assert data["host_s_per_wire_byte"] == pytest.approx(2e-9) and data["reduce_s_per_byte"] == pytest.approx(1e-9)
    net = pm.Network(4, 1e10, 200e-6, 0.8, 2e-9, 1e-9, 0.5)
    prof = pm.load_profile(profile_file)
    expect = pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=True).iter_time_s
    assert data["compressors"]["syncsgd"]["iter_time_s"][0] == pytest.approx(expect)
    assert run([*argv, "--calibration", "none"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "defaults" in data["calibration"] and data["host_s_per_wire_byte"] == 0.0
    assert run(["predict", "--profile", str(profile_file), "--calibration", str(path), "--bw", "1gbit"]) == 0
    assert "calibration " + path.name in capsys.readouterr().out.replace("\n", "")
    with pytest.raises(InputError, match="--calibration"):
        run(["predict", "--profile", str(profile_file), "--calibration", str(tmp_path / "nope.json")])


def test_predict_none_is_the_unshaped_calibrations_rate(tmp_path, profile_file, capsys):
    """`--bw 1gbit,none` as a sweep takes it: the unshaped link at the all-reduce bandwidth an unshaped calibration
    reached (not extrapolated); without one, a one-line error naming what to do."""
    from unit.testbed.perfmodel.test_calibration import synthetic_bench

    (tmp_path / "profiles").mkdir()
    for rate, b_ar in ((10**9, 0.9e9), (None, 6e9)):
        c = pm.calibration_from_bench(synthetic_bench(4, 200e-6, b_ar, 0.6 * b_ar, 2e-9, 1e-9), cluster="lab",
                                      rate_bps=rate)  # fmt: skip
        (tmp_path / "profiles" / pm.calibration_filename("lab", "gloo", 4, rate)).write_text(
            json.dumps(pm.calibration_to_dict(c)))  # fmt: skip
    argv = ["predict", "--profile", str(profile_file), "--world-size", "4", "--profiles", str(tmp_path / "profiles")]
    assert run([*argv, "--bw", "1gbit,none", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bandwidths_bps"] == pytest.approx([1e9, 6e9]) and data["unshaped_bps"] == pytest.approx(6e9)
    assert data["extrapolated_bps"] == []
    assert run([*argv, "--bw", "none"]) == 0
    out = capsys.readouterr().out
    assert "unshaped" in out and "(6gbit)" in out  # the row's label (a narrow table wraps it)
    with pytest.raises(InputError, match=r"^--bw none: .*there is none \(`testbed calibrate --bw none`\)"):
        run([*argv, "--bw", "1gbit,none", "--calibration", "none"])


# ---------------------------------------------------------------------------------------------- calibrate --bw list
def _calibrate_args(bw, **flags):
    parser = argparse.ArgumentParser(prog="testbed")
    model_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    argv = ["calibrate", "--name", "c"] + (["--bw", bw] if bw is not None else [])
    for k, v in flags.items():
        argv += [f"--{k}", v]
    return parser.parse_args(argv)


def test_calibrate_bw_list_gives_one_point_per_rate_in_order_with_the_shaping_flags_on_each():
    points = model_cli.calibration_points(_calibrate_args("100mbit,1gbit,none", burst="128kb"))
    assert [(s.rate_bps if s else None, u) for s, u in points] == [(100_000_000, False), (1_000_000_000, False),
                                                                   (None, True)]  # fmt: skip
    assert points[0][0].burst_bytes == points[1][0].burst_bytes == 128_000
    assert [(s.rate_bps if s else None, u) for s, u in model_cli.calibration_points(_calibrate_args("1gbit"))] == [
        (1_000_000_000, False)]  # fmt: skip
    assert model_cli.calibration_points(_calibrate_args("none")) == [(None, True)]
    assert model_cli.calibration_points(_calibrate_args(None)) == [(None, False)]  # the cluster's current shaping
    with pytest.raises(InputError, match="'1000mbit' is the same rate as '1gbit'"):
        model_cli.calibration_points(_calibrate_args("1gbit,1000mbit"))


def test_calibrate_with_a_bw_list_calibrates_at_each_rate_under_one_lease_and_prints_every_one(
        monkeypatch, tmp_path, capsys):  # fmt: skip
    """The handler's loop (one calibration per --bw item, in order, a JSON list); what one calibration does on a
    real cluster is tests/integration/test_calibrate.py."""
    import contextlib

    from testbed import calibrate, cluster_lease
    from testbed.cluster import backends
    from tests.unit.testbed.perfmodel.test_calibration import _at

    calls, leases = [], []

    def fake_calibration(cluster, out_dir, *, shape=None, unshaped=False, **_kw):
        calls.append((shape.rate_bps if shape else None, unshaped))
        c = _at(shape.rate_bps if shape else None, 1e-9, 0.0)
        return c, tmp_path / f"calibration-{len(calls)}.json"

    monkeypatch.setattr(calibrate, "run_calibration", fake_calibration)
    monkeypatch.setattr(backends, "open_cluster", lambda name: object())
    monkeypatch.setattr(cluster_lease, "hold", lambda name, **kw: leases.append(name) or contextlib.nullcontext())
    monkeypatch.setattr("testbed.launch.stop_on_signals", lambda: None)
    args = _calibrate_args("100mbit,none", out=str(tmp_path))
    args.json = True
    assert args.func(args) == 0
    assert calls == [(100_000_000, False), (None, True)] and leases == ["c"]
    printed = json.loads(capsys.readouterr().out)
    assert [p["rate_bps"] for p in printed] == [100_000_000, None]
    assert [p["path"] for p in printed] == [str(tmp_path / "calibration-1.json"), str(tmp_path / "calibration-2.json")]


def test_a_colocated_cpu_profile_takes_the_threads_a_local_trial_gives_each_rank(monkeypatch):
    """No --threads: with --colocated N on the CPU, cores // N (at least 1), as LocalCluster.threads_per_rank gives
    each rank of an N-rank trial; given, as given (0: torch's default); solo or on CUDA, torch's default."""
    import os

    from testbed.model_cli import profile_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert profile_threads(None, 4, "cpu") == 2 and profile_threads(None, 16, "cpu") == 1
    assert profile_threads(None, 1, "cpu") == 0 and profile_threads(None, 4, "cuda") == 0
    assert profile_threads(0, 4, "cpu") == 0 and profile_threads(3, 4, "cpu") == 3
