"""`testbed profile --colocated N [--on NAME]`: the profile is measured again by N processes training in lockstep (the
ranks that share the machine in a trial; with --on, on a cluster's hosts): compute, the slowest rank's lateness, each
compressor in place; none outlives it, and the cluster's shaping is put back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _lockstep_ranks(batch_size: int) -> list[int]:
    """PIDs of lockstep processes of a profile at this (test-unique) batch size."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--lockstep-rank" in argv and b"runners.profile" in argv and str(batch_size).encode() in argv:
            found.append(int(entry.name))
    return found


def _link_rates(testbed_cli, name: str) -> set[int | None]:
    status = json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    return {h["links"][d].get("rate_bps") for h in status["hosts"] for d in ("upload", "download")}


def test_the_compute_and_each_compressor_are_measured_in_processes_of_their_own():
    """In place, each compressor is the first model its processes train, as in a trial's fresh ranks (a process that
    trained before runs ACP-SGD's step faster: testbed.modelling.measure_lockstep)."""
    from testbed.modelling import measure_lockstep

    got = measure_lockstep(2, "mlp", 11, ["syncsgd", "topk"], None, image_size=None, seq_len=None, iters=1,
                           bucket_cap_mb=25, threads=1, device="cpu", timeout_s=200)  # fmt: skip
    assert sorted(got["codecs"]) == ["syncsgd", "topk"] and got["forward_s"] > 0
    assert sorted(got["pids"]) == ["compute", "syncsgd", "topk"]
    every = [pid for part in got["pids"].values() for pid in part]
    assert len(every) == 6 and len(set(every)) == 6, got["pids"]  # 2 ranks each, none shared
    assert _lockstep_ranks(11) == []


def test_a_failing_lockstep_rank_is_reported_and_none_is_left():
    """A rank that cannot start (here: an unknown compressor) fails the measurement with its own message."""
    from testbed.errors import TestbedError
    from testbed.modelling import measure_lockstep

    with pytest.raises(TestbedError, match=r"rank [01] failed \(exit 2\).*nosuch"):
        measure_lockstep(2, "mlp", 9, ["nosuch"], None, image_size=None, seq_len=None, iters=1, bucket_cap_mb=25,
                         threads=1, device="cpu", timeout_s=120)  # fmt: skip
    assert _lockstep_ranks(9) == []


def test_in_place_on_a_clusters_hosts_the_ranks_talk_over_its_shaped_links(make_cluster):
    """`measure_lockstep(on=(cluster, hosts))`: rank r runs on host r, gloo over its data NIC, where a trial's ranks
    run (bench/floor_vs_trial.py --namespaced). On a 2 Mbit/s cluster each sync SGD step then carries the wire time
    of its all-reduce: the mlp's 15,242 fp32 gradients, of which each of 2 ranks sends at least half (30 KB, 122 ms),
    where on loopback the step takes milliseconds. A lower bound: a loaded machine only adds to it."""
    from testbed.cluster.backends import open_cluster
    from testbed.errors import InputError
    from testbed.modelling import measure_lockstep

    name = make_cluster(2, "--bw", "2mbit")
    cluster = open_cluster(name)
    hosts = cluster.hosts()[:2]
    got = measure_lockstep(2, "mlp", 17, ["syncsgd"], None, image_size=None, seq_len=None, iters=1, bucket_cap_mb=25,
                           threads=1, device="cpu", timeout_s=300, on=(cluster, hosts))  # fmt: skip
    assert got["codecs"]["syncsgd"]["step_s"] >= 15_242 * 4 / 2 * 8 / 2e6 * 0.8, got["codecs"]["syncsgd"]
    assert len({pid for part in got["pids"].values() for pid in part}) == 4
    assert _lockstep_ranks(17) == []
    with pytest.raises(InputError, match=r"1 host\(s\) given for 2 ranks"):
        measure_lockstep(2, "mlp", 17, ["syncsgd"], None, image_size=None, seq_len=None, iters=1, bucket_cap_mb=25,
                         threads=1, device="cpu", on=(cluster, hosts[:1]))  # fmt: skip


def test_colocated_profile_on_a_cluster_measures_in_lockstep_on_its_hosts_and_leaves_nothing(make_cluster, testbed_cli,
                                                                                              tmp_path):
    """`testbed profile --colocated 2 --on NAME`: measured again by 2 processes training in lockstep, on the cluster's
    first hosts (the profile says which cluster), with its shaping cleared for the measurement and put back after;
    nothing is left noted or running. 2 ranks and 2 compressors (every rank imports torch; each compressor is the
    same lockstep loop): the baseline and one with a codec (topk: its encode time measured in place). On loopback (no
    --on) the same measurement is measure_lockstep's tests here and bench/gpu_check's CPU test, which profiles 2
    co-located ranks with powersgd (tests/integration/test_gpu_check.py)."""
    name = make_cluster(3, "--bw", "2mbit")
    out = tmp_path / "profiles"
    done = testbed_cli("profile", "--model", "mlp", "--batch-size", "7", "--threads", "1", "--colocated", "2",
                       "--iters", "2", "--compressors", "syncsgd,topk", "--on", name, "--out", str(out), "--json",
                       timeout_s=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["colocated_ranks"] == 2 and data["colocated_on"] == name and data["forward_s"] > 0
    assert data["lockstep_skew_s"] >= 0  # measured: the key is there only when the ranks ran together
    for comp in ("syncsgd", "topk"):  # each trained with by both ranks: its exposed communication
        assert data["compressors"][comp]["lockstep_comm_s"] >= 0, comp
        # and its whole step, the slowest rank's: at least the compute the ranks did in it
        assert data["compressors"][comp]["lockstep_step_s"] >= data["forward_s"], comp
    assert data["compressors"]["topk"]["buckets"][0]["encode_s"] > 0
    stored = json.loads((out / "mlp-bs7-cpu-colocated2.json").read_text())
    assert stored["colocated_on"] == name and stored["lockstep_skew_s"] == data["lockstep_skew_s"]
    assert _link_rates(testbed_cli, name) == {2_000_000}  # the cluster's own shaping is back
    assert "unfinished_trial" not in json.loads(testbed_cli("status", "--name", name, "--json").stdout)
    assert _lockstep_ranks(7) == [], "a lockstep rank outlived the profile"


def test_links_cleared_holds_the_links_unshaped_and_puts_them_back_however_left(make_cluster, testbed_cli):
    """testbed.cluster_lease.links_cleared (what `profile --on` measures inside): inside, no link is shaped and the
    work is noted for the next command; after, even after an error, the cluster's shaping is back and the note gone."""
    from testbed.cluster import registry
    from testbed.cluster.backends import open_cluster
    from testbed.cluster_lease import hold, links_cleared

    name = make_cluster(2, "--bw", "2mbit")
    with pytest.raises(RuntimeError, match="midway"), hold(name):
        with links_cleared(open_cluster(name), "test work"):
            assert _link_rates(testbed_cli, name) == {None}
            assert registry.trial_in_flight(name)["what"] == "test work"
            raise RuntimeError("midway")
    assert _link_rates(testbed_cli, name) == {2_000_000}
    assert registry.trial_in_flight(name) is None


def test_sigterm_during_a_profile_on_a_cluster_ends_its_ranks_and_puts_the_shaping_back(make_cluster, cli_env,
                                                                                         testbed_cli, tmp_path):
    """A signal while the in-place ranks run on the cluster's hosts: they are ended, the shaping is put back, nothing
    is stored, and the command exits 128 + 15. The test signals once the ranks run (found in /proc), never after a
    sleep; 5000 steps keep them running far longer than it takes to send it. The ranks' environment is a trial
    rank's allowlist: a credential of the controller's stays out of it."""
    import signal
    import subprocess
    import sys

    from conftest import REPO, ended_on_exit, wait_for

    name = make_cluster(2, "--bw", "2mbit")
    out = tmp_path / "profiles"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "profile", "--model", "mlp", "--batch-size", "29",
                             "--threads", "1", "--colocated", "2", "--iters", "5000", "--compressors", "syncsgd",
                             "--on", name, "--out", str(out)], env={**cli_env, "AWS_SECRET_ACCESS_KEY": "not-for-ranks"},
                            cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    with ended_on_exit(proc):
        ranks = wait_for(lambda: _lockstep_ranks(29), 240, "the in-place ranks started")
        environ = [Path(f"/proc/{p}/environ").read_bytes().split(b"\0") for p in ranks]
        assert _link_rates(testbed_cli, name) == {None}  # measured on unshaped links
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by a signal" in err and "nothing was stored" in err, err
    assert _lockstep_ranks(29) == [] and all(not Path(f"/proc/{p}").exists() for p in ranks)
    assert _link_rates(testbed_cli, name) == {2_000_000}
    assert not list(out.glob("*.json"))
    for env in environ:
        assert b"GLOO_SOCKET_IFNAME=eth0" in env and not any(v.startswith(b"AWS_SECRET_ACCESS_KEY=") for v in env)
