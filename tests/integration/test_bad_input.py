"""Bad input, through the real CLI: exit 2, exactly one line on stderr, no traceback, nothing on stdout, and nothing
changed (no namespaces, no qdiscs, no processes, no files, no cluster records).

Table-driven: grow the tables with each new flag. Most cases need no cluster (validation comes before the cluster is
even looked up); the cases that do share one 2-host cluster (module scope). Placeholders in argv: {w} the work
directory (the CLI's cwd, so default outputs such as ./results land there and are seen).

Which cases start a process: every case on the live cluster, and the first case of each command of the other tables
(`python -m testbed.cli CMD` / `python -m shaping apply`: that command's imports, `sys.exit(main())`, nothing more
on stderr at exit). The other cases of a command run the same entry point, `main(argv)`, in this process (its cwd the
work directory, the same environment), with the calls that would build or shape a cluster or start ranks made to fail
the test: the same refusal, without ~0.6 CPU-s of interpreter start and imports each.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    _teardown_cluster,
    cli_environment,
    netns_list,
    one_line,
    pids_in_netns,
    random_suffix,
    root_skip_reason,
)

import shaping.__main__ as shaping_main
from shaping.units import parse_rate_bps
from testbed import cli, ranks
from testbed.cluster import local
from testbed.config import Trial

GRID_50 = ["--bw", "1gbit,2gbit,3gbit,4gbit,5gbit,6gbit", "--compressor", "syncsgd,fp16,bf16,topk,signsgd,powersgd"]

# ------------------------------------------------------------------------------------------- no cluster needed
NO_CLUSTER = [
    # compressor options, checked by the controller through the catalogue (never inside the ranks)
    (["run", "--bw", "100mbit", "--compressor", "powersgd", "--rank", "0"], "--rank 0: powersgd rank 0"),
    (["run", "--bw", "100mbit", "--compressor", "topk", "--ratio", "2"], "topk ratio 2.0 is outside (0, 1]"),
    (["run", "--bw", "100mbit", "--compressor", "topk", "--ratio", "nan"], "topk ratio nan is outside (0, 1]"),
    (["run", "--bw", "100mbit", "--compressor", "mstopk", "--samplings", "0"], "mstopk samplings 0"),
    (["run", "--bw", "100mbit", "--compressor", "powersgd", "--start-iter", "1"], "must be >= 2"),
    (["run", "--bw", "100mbit", "--compressor", "powersgd", "--min-compression-rate", "nan"], "min_compression_rate"),
    (["run", "--bw", "100mbit", "--compressor", "topk", "--rank", "4"], "--rank does not apply to topk"),
    (["run", "--bw", "100mbit", "--compressor", "zip"], "unknown compressor 'zip'"),
    (["run", "--bw", "100mbit", "--error-feedback", "maybe"], "expected on or off"),
    (["sweep", "--bw", "1gbit", "--compressor", "powersgd", "--world-size", "2", "--rank", "0"], "rank 0"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2", "--ratio", "0.1"], "applies to no"),
    # plugin compressors (MODULE:FACTORY): checked in a subprocess that imports the plugin, before anything starts
    (["run", "--bw", "100mbit", "--compressor", "nosuchmod:make", "--plugin-path", "{w}/plug"], "no module named 'nosuchmod'"),
    (["run", "--bw", "100mbit", "--compressor", "good:nothere", "--plugin-path", "{w}/plug"], "has no factory 'nothere'"),
    (["run", "--bw", "100mbit", "--compressor", "good:raises", "--plugin-path", "{w}/plug"], "the factory raised RuntimeError: boom"),
    (["run", "--bw", "100mbit", "--compressor", "good:wrong", "--plugin-path", "{w}/plug"], "expected a (state, hook) tuple"),
    (["run", "--bw", "100mbit", "--compressor", "good:make", "--plugin-path", "{w}/plug", "--opt", "ratio=7"], "good ratio 7 is outside"),
    (["run", "--bw", "100mbit", "--compressor", "good:", "--plugin-path", "{w}/plug"], "is not MODULE:FACTORY"),
    (["run", "--bw", "100mbit", "--compressor", "good:make", "--plugin-path", "{w}/nowhere"], "nowhere: no such directory"),
    (["run", "--bw", "100mbit", "--plugin-path", "{w}/plug"], "--plugin-path applies to MODULE:FACTORY"),
    (["run", "--bw", "100mbit", "--compressor", "good:make", "--opt", "ratio"], "--opt 'ratio': expected KEY=VALUE"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd,good:raises", "--world-size", "2", "--plugin-path", "{w}/plug"], "boom"),
    (["sweep", "--config", "{w}/plugin-bad-option.toml"], "good ratio 7 is outside"),
    (["profile", "--model", "mlp", "--compressors", "good:wrong", "--plugin-path", "{w}/plug"], "expected a (state, hook)"),
    (["check-compressor", "good:raises", "--plugin-path", "{w}/plug"], "boom"),
    (["check-compressor", "zip"], "unknown compressor 'zip'"),
    # trial values checked too late before
    (["run", "--bw", "100mbit", "--bucket-cap-mb", "nan"], "--bucket-cap-mb nan"),
    (["run", "--bw", "100mbit", "--bucket-cap-mb", "0"], "--bucket-cap-mb 0"),
    (["run", "--bw", "100mbit", "--image-size", "0"], "--image-size 0"),
    (["run", "--bw", "100mbit", "--seq-len", "100000"], "--seq-len 100000"),
    (["run", "--bw", "100mbit", "--timeout", "0"], "--timeout 0"),
    (["run", "--bw", "100mbit", "--timeout", "nan"], "--timeout nan"),
    (["run", "--bw", "100mbit", "--timeout", "inf"], "--timeout inf"),
    (["run", "--bw", "100mbit", "--batch-size", "0"], "--batch-size 0"),
    (["run", "--bw", "100mbit", "--iters", "0"], "--iters 0"),
    (["run", "--bw", "100mbit", "--model", "vgg"], "--model 'vgg': unknown"),
    (["run", "--bw", "none", "--burst", "125kb"], "need a rate"),
    (["run", "--bw", "9gbps"], "ambiguous unit"),
    (["run"], "run needs --bw"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2", "--timeout", "-1"], "--timeout -1"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "two"], "comma-separated integers"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "0"], "--world-size 0"),
    # empty strings for lists, sizes and paths
    (["run", "--bw", ""], "--bw '': empty"),
    (["run", "--bw", "100mbit", "--burst", ""], "--burst '': empty"),
    (["run", "--bw", "100mbit", "--compressor", " "], "--compressor ' ': empty"),
    (["run", "--bw", "100mbit", "--out", ""], "--out '': empty"),
    (["sweep", "--bw", "", "--compressor", "syncsgd", "--world-size", "2"], "--bw '': empty"),
    (["sweep", "--bw", ",", "--compressor", "syncsgd", "--world-size", "2"], "--bw: empty"),
    # an empty rate (an unset shell variable) is refused wherever a rate is read; unshaped is spelled none
    (["run", "--bw", " "], "--bw ' ': empty"),
    (["run", "--bw", "0"], "an unshaped link is spelled none"),
    (["sweep", "--bw", "1gbit,", "--compressor", "syncsgd", "--world-size", "2"], "item 2 of 2 is empty"),
    (["sweep", "--bw", "none,0", "--compressor", "syncsgd", "--world-size", "2"], "spelled none"),
    (["sweep", "--config", "{w}/empty-rate.toml"], "empty (an unset variable?)"),
    (["up", "--bw", ""], "--bw '': empty"),
    (["shape", "--bw", ""], "--bw '': empty"),
    (["shape", "--bw", "none"], "use --clear"),
    (["predict", "--model", "resnet18", "--bw", "1gbit,"], "empty (an unset variable?)"),
    (["predict", "--model", "resnet18", "--bw", "10mbit.."], "empty (an unset variable?)"),
    (["sweep", "--config", ""], "--config '': empty"),
    (["up", "--inventory", ""], "--inventory '': empty"),
    (["up", "--subnet", ""], "--subnet '': empty"),
    (["up", "--bw", "1gbit", "--delay", ""], "--delay '': empty"),
    (["shape", "--bw", "1gbit", "--hosts", ""], "--hosts '': empty"),
    (["probe", "--streams", ""], "--streams '': empty"),
    (["probe", "--pairs", ""], "--pairs '': empty"),
    (["results", ""], "PATH '': empty"),
    (["results", "{w}/store", "--csv", ""], "--csv '': empty"),
    (["report", ""], "RESULTS_DIR '': empty"),
    (["predict", "--model", "resnet18", "--bw", ""], "--bw '': empty"),
    (["profile", "--model", "mlp", "--compressors", ""], "--compressors '': empty"),
    (["exec", "", "--", "true"], "HOST '': empty"),
    # sweep files
    (["sweep", "--config", "{w}/latin1.toml"], "not UTF-8"),
    (["sweep", "--config", "{w}/empty-grid.toml"], "empty grid"),
    (["sweep", "--config", "{w}/orphan-options.toml"], "options for 'topk', which is not in compressor"),
    (["sweep", "--config", "{w}/bad-option.toml"], "powersgd rank 0"),
    (["sweep", "--config", "{w}/nan-bucket.toml"], "--bucket-cap-mb nan"),
    (["sweep", "--config", "{w}/missing.toml"], "cannot read"),
    (["sweep", "--config", "{w}/adir"], "cannot read"),
    # sweep flags that --config would silently ignore
    (["sweep", "--config", "{w}/good.toml", "--model", "mlp"], "--model with --config"),
    (["sweep", "--config", "{w}/good.toml", "--bw", "1gbit"], "--bw with --config"),
    (["sweep", "--config", "{w}/good.toml", "--rank", "2", "--iters", "3"], "--iters, --rank with --config"),
    # a grid too large to start without a word
    (["sweep", *GRID_50, "--world-size", "2,3"], "more than 50 trials need --yes"),
    # probe tolerances and counts
    (["probe", "--tolerance", "0"], "--tolerance 0"),
    (["probe", "--tolerance", "1"], "--tolerance 1"),
    (["probe", "--tolerance", "1.5"], "--tolerance 1.5"),
    (["probe", "--tolerance", "nan"], "--tolerance nan"),
    (["up", "--bw", "100mbit", "--tolerance", "0.5"], "it needs --verify"),
    (["up", "--bw", "100mbit", "--verify", "--tolerance", "1.5"], "--tolerance 1.5"),
    (["shape", "--bw", "100mbit", "--tolerance", "0.5"], "it needs --verify"),
    (["probe", "--max-pairs", "0"], "--max-pairs 0"),
    (["probe", "--duration", "inf"], "--duration inf"),
    (["probe", "--pairs", "h0:h1", "--all-pairs"], "exclude each other"),
    (["probe", "--duration", "0.5"], "iperf3 reads -t as an integer"),
    (["run", "--bw", "100mbit", "--probe-streams", "0"], "--probe-streams 0"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2", "--probe-duration", "0"], "--probe-duration 0"),
    (["exec", "--timeout", "0", "h0", "--", "true"], "--timeout 0"),
    # the performance model
    (["predict", "--model", "resnet18", "--points", "1000000"], "--points 1000000"),
    (["predict", "--model", "resnet18", "--points", "1"], "--points 1"),
    (["predict", "--model", "vgg16", "--profiles", "{w}/profiles"], "--model 'vgg16': unknown"),
    (["predict", "--model", "mlp", "--compute-speedup", "inf"], "--compute-speedup inf"),
    (["predict", "--model", "mlp", "--world-size", "0"], "--world-size 0"),
    (["profile", "--model", "vgg16"], "--model 'vgg16': unknown"),
    (["profile", "--model", "mlp", "--image-size", "0"], "--image-size 0"),
    (["profile", "--model", "mlp", "--bucket-cap-mb", "nan"], "--bucket-cap-mb nan"),
    (["profile", "--model", "mlp", "--threads", "-1"], "--threads -1"),
    # `profile --on NAME` ({n}: a cluster name that is not up here)
    (["profile", "--model", "mlp", "--on", "{n}"], "give --colocated N >= 2"),
    (["profile", "--model", "mlp", "--wait", "5"], "--wait 5: applies to --on NAME"),
    (["profile", "--model", "mlp", "--colocated", "2", "--on", "{n}", "--device", "cuda"], "accepted only on the CPU"),
    (["profile", "--model", "mlp", "--colocated", "2", "--on", "{n}"], "no cluster named"),
    (["profile", "--model", "mlp", "--colocated", "2", "--on", "{n}", "--wait", "nan"], "--wait nan"),
    # calibrate: checked before the cluster is looked up
    (["calibrate", "--sizes", "1mb"], "at least 2 distinct message sizes"),
    (["calibrate", "--sizes", "16kb,2gb"], "outside 1 KB..1 GB"),
    (["calibrate", "--sizes", "16kb,lots"], "--sizes"),
    (["calibrate", "--sizes", ""], "--sizes '': empty"),
    (["calibrate", "--reps", "0"], "--reps 0"),
    (["calibrate", "--timeout", "nan"], "--timeout nan"),
    (["calibrate", "--probe-s", "0"], "--probe-s 0: expected seconds in (0, 60]"),
    (["calibrate", "--probe-s", "inf"], "--probe-s inf: expected seconds in (0, 60]"),
    (["calibrate", "--world-size", "1"], "at least 2 ranks"),
    (["calibrate", "--cross-traffic", "-1"], "--cross-traffic -1: expected an integer from 0 to 16"),
    (["calibrate", "--bw", "9gbps"], "ambiguous unit"),
    (["calibrate", "--bw", "1gbit,1000mbit"], "'1000mbit' is the same rate as '1gbit'; accepted: each rate once"),
    (["calibrate", "--bw", "none,unshaped"], "'unshaped' is the same rate as 'none'"),
    (["calibrate", "--bw", "100mbit,"], "--bw '': empty"),
    (["calibrate", "--bw", "100mbit,lots"], "--bw"),
    (["calibrate", "--out", "{w}/afile"], "is a file"),
    (["calibrate"], "no cluster named"),
    (["predict", "--model", "mlp", "--calibration", "{w}/nope.json"], "--calibration"),
    (["report", "{w}/store", "--calibration", "{w}/nope.json"], "--calibration"),
    # output paths: a file where a directory is needed, a missing parent, not writable
    (["run", "--bw", "100mbit", "--out", "{w}/afile"], "is a file"),
    (["run", "--bw", "100mbit", "--out", "{w}/no/such/dir"], "parent directory"),
    (["run", "--bw", "100mbit", "--out", "/proc/testbed-results"], "cannot write"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2", "--out", "{w}/afile"], "is a file"),
    (["results", "{w}/store", "--csv", "{w}/adir"], "is a directory"),
    (["results", "{w}/store", "--csv", "{w}/no/such/x.csv"], "parent directory"),
    (["results", "{w}/store", "--csv", "/proc/x.csv"], "cannot write"),
    (["results", "{w}/afile"], "is a file"),
    (["results", "{w}/nothing-here"], "does not exist"),
    (["profile", "--model", "mlp", "--out", "{w}/afile"], "is a file"),
    (["profile", "--model", "mlp", "--out", "{w}/no/such/dir"], "parent directory"),
    (["report", "{w}/store", "--out", "{w}/afile"], "is a file"),
    (["report", "{w}/store", "--out", "{w}/no/such/dir"], "parent directory"),
    (["report", "{w}/store", "--out", "/proc/testbed-report"], "cannot write"),
    # (a stored-ok trial is refused once the cluster is known: its id is that of the trial resolved for the hosts)
    # run/sweep never bring a cluster up (nothing would take it down)
    (["run", "--bw", "100mbit", "--rerun", "--out", "{w}/store"], "`testbed up --name"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2"], "`testbed up --name"),
    # cluster commands on a cluster that is not up (`shape --bw 1gbit`, `exec h0 -- true`, `up --hosts 0`, `up --bw 0`
    # and `up --bw 9gbps` are in tests/unit/testbed/test_cli_input.py::BAD_INPUT, the last also as a real process)
    (["status"], "no cluster named"),
    # learning (issue 33): data sets, evaluation, targets, seeds
    (["run", "--bw", "none", "--data", "mnist"], "--data 'mnist': unknown data set; accepted synthetic, fashion-mnist"),
    (["run", "--bw", "none", "--data", "cifar10:data"], "cifar10 needs an absolute directory"),
    (["run", "--bw", "none", "--data", "fashion-mnist:/x"], "fashion-mnist takes no directory"),
    (["run", "--bw", "none", "--model", "mlp", "--data", "fashion-mnist"], "--model mlp does not train on"),
    (["run", "--bw", "none", "--data", "fashion-mnist", "--eval-every", "0"], "--eval-every 0"),
    (["run", "--bw", "none", "--eval-every", "10"], "--eval-every needs a real data set"),
    (["run", "--bw", "none", "--data", "fashion-mnist", "--eval-every", "10", "--max-steps", "100",
      "--target-accuracy", "1.5"], "--target-accuracy 1.5: expected a fraction in (0, 1]"),
    (["run", "--bw", "none", "--data", "fashion-mnist", "--eval-every", "10", "--max-steps", "100",
      "--target-accuracy", "0"], "--target-accuracy 0.0: expected a fraction in (0, 1]"),
    (["run", "--bw", "none", "--data", "fashion-mnist", "--target-accuracy", "0.8"], "needs --eval-every N"),
    (["run", "--bw", "none", "--data", "fashion-mnist", "--max-steps", "3"], "more than --warmup-iters 5"),
    (["run", "--bw", "none", "--lr", "nan"], "--lr nan"),
    (["sweep", "--bw", "none", "--compressor", "syncsgd", "--world-size", "2", "--seeds", "0"], "--seeds 0"),
    (["check-compressor", "syncsgd", "--convergence", "--target-accuracy", "2"], "--target-accuracy 2.0: expected"),
    (["check-compressor", "syncsgd", "--convergence", "--max-steps", "10"], "--max-steps 10: expected an integer"),
]

# `--device cuda` is only bad input where no GPU is visible
CUDA = [
    (["profile", "--model", "mlp", "--device", "cuda"], "--device cuda: no CUDA GPU"),
    (["predict", "--model", "mlp", "--device", "cuda", "--profiles", "{w}/profiles"], "--device cuda: no CUDA GPU"),
]

SHAPING_CLI = [  # the host-side CLI that lab hosts run (commit-confirmed shaping)
    (["apply", "--dev", "lo", "--bw", "1gbit", "--confirm-within", "inf", "--dry-run"], "--confirm-within inf"),
    (["apply", "--dev", "lo", "--bw", "1gbit", "--confirm-within", "nan", "--dry-run"], "--confirm-within nan"),
    (["apply", "--dev", "lo", "--bw", "1gbit", "--confirm-within", "0", "--dry-run"], "--confirm-within 0"),
    (["apply", "--dev", "lo", "--bw", "1gbit", "--confirm-within", "86400", "--dry-run"], "--confirm-within 86400"),
]

SHAPING_CLI_RATES = [  # `python -m shaping apply` reads a rate too: empty is refused, and there is no unshaped apply
    (["apply", "--dev", "lo", "--bw", "", "--dry-run"], "--bw '': empty (an unset variable?)"),
    (["apply", "--dev", "lo", "--bw", " ", "--dry-run"], "--bw ' ': empty"),
    (["apply", "--dev", "lo", "--bw", "none", "--dry-run"], "python -m shaping clear"),
    (["apply", "--dev", "lo", "--bw", "0", "--dry-run"], "out of range"),
]

# ------------------------------------------------------------------------------------------- on a live cluster
ON_CLUSTER = [
    (["run", "--bw", "100mbit", "--world-size", "5"], "needs 5 hosts; the cluster has 2"),
    (["run", "--bw", "100mbit", "--compressor", "topk", "--ratio", "0"], "topk ratio 0.0 is outside (0, 1]"),
    (["run", "--bw", "100mbit", "--image-size", "0"], "--image-size 0"),
    (["run", "--bw", "100mbit", "--out", "{w}/store"], "add --rerun"),
    (["sweep", "--bw", "1gbit", "--compressor", "syncsgd", "--world-size", "2,5"], "needs 5 hosts; the cluster has 2"),
    (["sweep", *GRID_50, "--world-size", "1,2"], "more than 50 trials need --yes"),
    (["shape", "--bw", "1gbit", "--hosts", "h0,h9"], "unknown host 'h9'"),
    (["shape", "--bw", "0"], "out of range"),
    (["probe", "--pairs", "h0:h9"], "unknown host 'h9'"),
    (["probe", "--tolerance", "2"], "--tolerance 2"),
    (["profile", "--model", "mlp", "--colocated", "3", "--on", "{n}"], "2 host(s) for --colocated 3; expected at least"),
    (["up", "--hosts", "3", "--bw", "1gbit"], "Use --recreate"),
    # a data set missing or malformed on a host: named, before any trial (issue 33)
    (["run", "--bw", "100mbit", "--data", "cifar10:{w}/nodata"], "host h0: "),
    (["run", "--bw", "100mbit", "--data", "imagefolder:{w}"], "expected train/CLASS/IMAGE and test/CLASS/IMAGE"),
]


# ------------------------------------------------------------------------------------------- fixtures
def _write_inputs(w: Path, stored_name: str) -> None:
    (w / "afile").write_text("not a directory\n")
    (w / "adir").mkdir()
    head = '[sweep]\nbw = ["100mbit"]\ncompressor = ["syncsgd", "powersgd"]\nworld_size = [2]\n'
    (w / "good.toml").write_text(head)
    (w / "latin1.toml").write_bytes(head.encode() + "# d\xe9bit\n".encode("latin-1"))
    (w / "empty-grid.toml").write_text('[sweep]\nbw = []\ncompressor = ["syncsgd"]\nworld_size = [2]\n')
    (w / "orphan-options.toml").write_text(head + "[sweep.options.topk]\nratio = 0.01\n")
    (w / "bad-option.toml").write_text(head + "[sweep.options.powersgd]\nrank = 0\n")
    (w / "empty-rate.toml").write_text(head.replace('["100mbit"]', '["100mbit", ""]'))
    (w / "nan-bucket.toml").write_text(head + "bucket_cap_mb = nan\n")
    plug = w / "plug"
    plug.mkdir()
    (plug / "good.py").write_text(
        "def make(process_group=None, ratio=0.1):\n"
        "    if not 0 < ratio <= 1:\n        raise ValueError(f'good ratio {ratio} is outside (0, 1]')\n"
        "    return object(), lambda state, bucket: None\n"
        "def raises(process_group=None):\n    raise RuntimeError('boom')\n"
        "def wrong(process_group=None):\n    return 42\n"
    )
    (w / "plugin-bad-option.toml").write_text(
        '[sweep]\nbw = ["100mbit"]\ncompressor = ["good:make"]\nworld_size = [2]\nplugin_path = "plug"\n'
        '[sweep.options."good:make"]\nratio = 7\n'
    )
    # a results store holding an ok trial: `run --bw 100mbit` (all defaults, 2 ranks) on cluster `stored_name`
    from testbed.results import ResultsStore

    # as `run` resolves it on a CPU cluster: gloo, one rank per host
    trial = Trial(compressor="syncsgd", rate_bps=parse_rate_bps("100mbit"), world_size=2, cluster=stored_name,
                  backend="gloo", ranks_per_host=1)  # fmt: skip
    ResultsStore(w / "store").append(
        {"trial_id": trial.trial_id, "status": "ok", "started_at": "2025-01-01T00:00:00+00:00", "model": "resnet18",
         "compressor": "syncsgd", "compressor_options": "{}", "world_size": 2, "rate_bps": 100_000_000,
         "iter_time_s_mean": 1.0, "samples_per_s": 64.0, "wall_s": 10.0}
    )  # fmt: skip


def _snapshot(*roots: Path, cluster: str) -> str:
    """Everything a bad input must leave alone, as one comparable digest: files (name, size, mtime) and directories
    under the roots,
    the cluster's namespaces (other sessions make their own on this machine) and in each its processes and qdiscs."""
    items = []
    for root in roots:
        for p in sorted(root.rglob("*")):
            st = p.lstat()  # a directory's mtime moves with the write check (a temp file made and removed), a lock
            # file's when it is taken: neither is a change
            same = (p.is_dir() and not p.is_symlink()) or p.suffix == ".lock"
            items.append(f"{p}" if same else f"{p} {st.st_size} {st.st_mtime_ns}")
    for ns in [n for n in netns_list() if n.startswith(f"tb-{cluster}-")]:
        items.append(f"{ns} pids {pids_in_netns(ns)}")
        qd = subprocess.run(["tc", "-n", ns, "qdisc", "show"], capture_output=True, text=True).stdout
        items += [line for line in qd.splitlines() if line.startswith("qdisc")]
    return hashlib.sha256("\n".join(items).encode()).hexdigest() + f" ({len(items)} items)"


pytestmark = pytest.mark.xdist_group("test_bad_input")  # module-scoped cluster and work directory


@pytest.fixture(scope="module")
def env(state_dir: Path) -> dict[str, str]:
    return cli_environment(state_dir)


@pytest.fixture(scope="module")
def idle_name() -> str:
    return "t" + random_suffix()


@pytest.fixture(scope="module")
def work(tmp_path_factory, idle_name) -> Path:
    w = tmp_path_factory.mktemp("bad-input")
    _write_inputs(w, idle_name)
    return w


@pytest.fixture(scope="module")
def shared_cluster(env, work):
    """One 2-host cluster for every case that needs one; its store holds the ok trial `run --bw 100mbit` makes."""
    reason = root_skip_reason()
    if reason:
        pytest.skip(reason)
    name = "t" + random_suffix()
    from testbed.results import ResultsStore

    trial = Trial(compressor="syncsgd", rate_bps=parse_rate_bps("100mbit"), world_size=2, cluster=name,
                  backend="gloo", ranks_per_host=1)  # fmt: skip
    ResultsStore(work / "store").append({"trial_id": trial.trial_id, "status": "ok", "compressor": "syncsgd"})
    try:
        done = _cli(env, work, "up", "--name", name, "--hosts", "2", "--bw", "1gbit")
        assert done.returncode == 0, done.stderr
        yield name
    finally:
        _teardown_cluster(env, name)


def _cli(env: dict[str, str], cwd: Path, *args: str, module: str = "testbed.cli") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


NAMELESS = ("results", "report", "profile", "predict", "check-compressor")  # commands without --name


def _argv(argv: list[str], work: Path, name: str) -> list[str]:
    argv = [a.replace("{w}", str(work)).replace("{n}", name) for a in argv]
    return argv if argv[0] in NAMELESS else [argv[0], "--name", name, *argv[1:]]


def _check_refused(done: subprocess.CompletedProcess, command: str, why: str) -> None:
    assert done.returncode == 2, f"exit {done.returncode}; stdout {done.stdout[-500:]!r} stderr {done.stderr[-800:]!r}"
    line = one_line(done.stderr)  # exactly one line, no traceback
    assert line.startswith(f"testbed {command}: error: "), line
    assert why in line, line
    assert done.stdout == ""


class Touched(AssertionError):
    pass


def _trap(*args, **kwargs):
    raise Touched(f"the CLI tried to change the machine or start ranks on bad input: {args} {kwargs}")


@pytest.fixture
def in_process(monkeypatch, capsys, work):
    """`main(argv)` of testbed.cli or shaping in this process, as `python -m ... ARGV` in `work` would run it:
    (exit code, stdout, stderr). Building, destroying or shaping a cluster and starting ranks fail the test."""
    monkeypatch.setattr(local, "_build", _trap)
    monkeypatch.setattr(local, "_destroy", _trap)
    monkeypatch.setattr(local.tc, "apply", _trap)
    monkeypatch.setattr(local.tc, "clear", _trap)
    monkeypatch.setattr(ranks, "start", _trap)
    monkeypatch.delenv("TESTBED_CLUSTER", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(work)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}  # cli.main installs its own

    def call(module: str, argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = (cli.main if module == "testbed.cli" else shaping_main.main)(argv)
        except SystemExit as e:  # argparse
            rc = e.code
        out, err = capsys.readouterr()
        return rc, out, err

    yield call
    for s, h in handlers.items():
        signal.signal(s, h)


def _refuse(in_process, real: bool, env, work, argv: list[str], module: str = "testbed.cli"):
    """The case as a process (`real`) or in this process: (exit code, stdout, stderr)."""
    if real:
        done = _cli(env, work, *argv, module=module)
        return done.returncode, done.stdout, done.stderr
    return in_process(module, argv)


# ------------------------------------------------------------------------------------------- the tables
def _ids(table):
    return [" ".join(a) or "(none)" for a, _ in table]


def _plugin(argv: list[str]) -> bool:
    return any(":" in a and not a.startswith(("{w}", "/", "h")) for a in argv)


def _cases(table):
    """pytest params of a table: the first case of each command that imports no plugin runs as a real process (id
    prefixed `process:`), the others in this process."""
    seen: set[str] = set()
    params = []
    for argv, why in table:
        real = argv[0] not in seen and not _plugin(argv)
        if real:
            seen.add(argv[0])
        params.append(pytest.param(argv, why, real, id=("process: " if real else "") + (" ".join(argv) or "(none)")))
    return params


def _check_refused_rc(rc: int, out: str, err: str, command: str, why: str) -> None:
    assert rc == 2, f"exit {rc}; stdout {out[-500:]!r} stderr {err[-800:]!r}"
    line = one_line(err)  # exactly one line, no traceback
    assert line.startswith(f"testbed {command}: error: "), line
    assert why in line, line
    assert out == ""


@pytest.mark.parametrize(("argv", "why", "real"), _cases(NO_CLUSTER))
def test_refused_before_anything_is_looked_up(env, work, state_dir, idle_name, in_process, argv, why, real):
    before = _snapshot(work, state_dir, cluster=idle_name)
    rc, out, err = _refuse(in_process, real, env, work, _argv(argv, work, idle_name))
    _check_refused_rc(rc, out, err, argv[0], why)
    assert _snapshot(work, state_dir, cluster=idle_name) == before


@pytest.mark.parametrize(("argv", "why"), CUDA, ids=_ids(CUDA))
def test_device_cuda_without_a_gpu(env, work, state_dir, in_process, argv, why):
    """In this process: `profile` and `predict` are started as processes by the first table."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible here: --device cuda is valid input on this machine")
    before = _snapshot(work, state_dir, cluster="none")
    rc, out, err = in_process("testbed.cli", [a.replace("{w}", str(work)) for a in argv])
    _check_refused_rc(rc, out, err, argv[0], why)
    assert _snapshot(work, state_dir, cluster="none") == before


@pytest.mark.parametrize(("argv", "why", "real"), _cases(SHAPING_CLI))
def test_shaping_cli_confirm_within_is_bounded(env, work, in_process, argv, why, real):
    before = _snapshot(work, cluster="none")
    rc, _, err = _refuse(in_process, real, env, work, argv, module="shaping")
    assert rc == 2
    line = one_line(err)
    assert why in line and "seconds in (0, 3600]" in line
    assert _snapshot(work, cluster="none") == before


@pytest.mark.parametrize(("argv", "why", "real"), _cases(SHAPING_CLI_RATES))
def test_shaping_cli_refuses_an_empty_rate(env, work, in_process, argv, why, real):
    before = _snapshot(work, cluster="none")
    rc, out, err = _refuse(in_process, real, env, work, argv, module="shaping")
    assert rc == 2, err
    line = one_line(err)
    assert line.startswith("error: ") and why in line, line
    assert out == ""
    assert _snapshot(work, cluster="none") == before


@pytest.mark.root
@pytest.mark.parametrize(("argv", "why"), ON_CLUSTER, ids=_ids(ON_CLUSTER))
def test_refused_on_a_live_cluster_changes_nothing(env, work, state_dir, shared_cluster, argv, why):
    before = _snapshot(work, state_dir, cluster=shared_cluster)
    done = _cli(env, work, *_argv(argv, work, shared_cluster))
    _check_refused(done, argv[0], why)
    assert _snapshot(work, state_dir, cluster=shared_cluster) == before


# ------------------------------------------------------------------------------------------- not bad input, but
def test_an_unreadable_row_is_a_warning_not_a_failure(env, tmp_path):
    from testbed.results import ResultsStore

    store = ResultsStore(tmp_path / "res")
    store.append({"trial_id": "aaaaaaaaaaaaaaaa", "status": "ok", "compressor": "syncsgd", "model": "mlp"})
    (store.rows_dir / "bbbbbbbbbbbbbbbb.parquet").write_bytes(b"PAR1 truncated")
    done = _cli(env, tmp_path, "results", str(tmp_path / "res"), "--json")
    assert done.returncode == 0, done.stderr
    assert [r["trial_id"] for r in json.loads(done.stdout)] == ["aaaaaaaaaaaaaaaa"]
    line = one_line(done.stderr)
    assert line.startswith("warning: skipped unreadable results row") and "bbbbbbbbbbbbbbbb.parquet" in line
    done = _cli(env, tmp_path, "results", str(tmp_path / "res"), "--csv", str(tmp_path / "all.csv"))
    assert done.returncode == 0 and (tmp_path / "all.csv").read_text().count("\n") == 2


@pytest.mark.root
def test_status_reports_a_half_made_cluster_and_down_removes_it(env, tmp_path):
    """An interrupted `up` leaves namespaces without a record: `status` says so (exit 1), `down` removes them. Only
    namespaces the testbed marked as its own count: a foreign one with the cluster's prefix is neither."""
    name = "t" + random_suffix()
    ns, foreign = f"tb-{name}-h0", f"tb-{name}-vpn"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    subprocess.run(["ip", "netns", "add", foreign], check=True, capture_output=True)
    # the mark `up` gives every namespace it makes (testbed.cluster.local.MARK_PREFIX)
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "alias", f"testbed-cluster:{name}"], check=True)
    try:
        done = _cli(env, tmp_path, "status", "--name", name)
        assert done.returncode == 1
        line = one_line(done.stderr)
        assert "half-made" in line and ns in line and f"testbed down --name {name}" in line and foreign not in line
        every = _cli(env, tmp_path, "status", "--all", "--json")
        assert {"name": name, "half_made": True, "namespaces": [ns]} in json.loads(every.stdout)
        assert _cli(env, tmp_path, "down", "--name", name).returncode == 0
        assert ns not in netns_list() and foreign in netns_list()
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "delete", foreign], capture_output=True, check=False)
