"""A compressor plugin written outside the package (examples/randk.py) through the path users take: `testbed run`,
`sweep`, `profile`, `predict` and `report` on a real 2-host emulated cluster with real gloo ranks (root).
Tiny model and few iterations; about a minute on 2 cores."""

from __future__ import annotations

import hashlib
import json
import os

import pandas as pd
import pytest
from conftest import REPO

pytestmark = pytest.mark.root

FAST = ["--model", "mlp", "--batch-size", "8", "--iters", "3", "--warmup-iters", "2", "--no-probe"]
EXAMPLES = REPO / "examples"
RANDK_SHA = hashlib.sha256((EXAMPLES / "randk.py").read_bytes()).hexdigest()


def test_plugin_runs_like_a_builtin(make_cluster, testbed_cli, cli_env, tmp_path):
    from testbed.results import load_results

    name = make_cluster(2)
    out = tmp_path / "res"
    plugin = ["--compressor", "randk:make", "--plugin-path", "examples", "--opt", "ratio=0.05"]

    # the plan puts the plugin directory first on the ranks' PYTHONPATH; an emulated host is this machine, so the
    # controller's own (absolute) entries follow (docs/lab-guide.md, "What reaches a rank's environment")
    dry = testbed_cli("run", "--name", name, "--bw", "200mbit", *plugin, *FAST, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert cli_env["PYTHONPATH"].startswith(str(REPO))
    assert {r["env"]["PYTHONPATH"] for r in plan["plan"]["ranks"]} == {f"{EXAMPLES}:{REPO}"}
    assert plan["trial"]["plugin_path"] == str(EXAMPLES) and plan["trial"]["options"] == {"ratio": 0.05}
    assert plan["plugin"]["sha256"] == RANDK_SHA and plan["plugin"]["imported"] is False  # located, not run

    done = testbed_cli("run", "--name", name, "--bw", "200mbit", *plugin, *FAST, "--out", str(out), timeout_s=180)
    assert done.returncode == 0, done.stdout[-800:] + done.stderr[-800:]

    # a sweep file with the plugin beside the baseline: its options table and plugin path (relative to the file)
    sweep = tmp_path / "plugin.toml"
    rel = os.path.relpath(EXAMPLES, tmp_path)
    sweep.write_text(
        '[sweep]\nbw = ["200mbit"]\ncompressor = ["syncsgd", "randk:make"]\nworld_size = [2]\nmodel = "mlp"\n'
        f'batch_size = 8\niters = 3\nwarmup_iters = 2\nplugin_path = "{rel}"\n[sweep.options."randk:make"]\nratio = 0.05\n'
    )
    done = testbed_cli("sweep", "--name", name, "--config", str(sweep), "--out", str(out), "--no-probe", timeout_s=240)
    assert done.returncode == 0, done.stdout[-800:] + done.stderr[-800:]
    assert "1 already stored, 1 to run" in done.stdout  # the sweep's randk trial is the one `run` measured

    df = load_results(out)
    assert sorted(df["compressor"]) == ["randk:make", "syncsgd"]
    assert (df["status"] == "ok").all(), df[["compressor", "error"]].to_string()
    rk = df[df["compressor"] == "randk:make"].iloc[0]
    base = df[df["compressor"] == "syncsgd"].iloc[0]
    assert (rk["plugin_module"], rk["plugin_version"], rk["plugin_sha256"]) == ("randk", "1.0", RANDK_SHA)
    assert rk["plugin_path"] == str(EXAMPLES) and "payload" in rk["plugin_assumed"]
    assert pd.isna(base["plugin_module"])
    # ratio 0.05 of the gradient, counted from what the hook handed to gloo
    assert 0 < rk["payload_bytes_per_iter"] < 0.1 * base["payload_bytes_per_iter"]

    profiles = tmp_path / "profiles"
    done = testbed_cli("profile", "--model", "mlp", "--batch-size", "8", "--iters", "2", "--compressors",
                       "syncsgd,randk:make", "--plugin-path", "examples", "--opt", "ratio=0.05", "--out",
                       str(profiles), "--json", timeout_s=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    prof = json.loads(done.stdout)["compressors"]["randk:make"]
    assert prof["collective"] == "allreduce" and prof["rounds"] == 1 and prof["assumed"]
    done = testbed_cli("predict", "--model", "mlp", "--batch-size", "8", "--profiles", str(profiles), "--world-size",
                       "2", "--bw", "200mbit", "--compressors", "randk:make", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    pred = json.loads(done.stdout)["compressors"]["randk:make"]
    assert pred["iter_time_s"][0] > 0 and pred["assumed"]

    done = testbed_cli("report", str(out), "--out", str(tmp_path / "report"), "--profiles", str(profiles), "--json")
    assert done.returncode == 0, done.stderr[-800:]
    assert "randk:make" in (tmp_path / "report" / "summary.md").read_text()
