"""One home per default and per fact (issue 31): the trial defaults, the compressor names, the dense baselines."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from runners import catalog
from runners.contract import DEFAULT_PROBE_S, TRAINING_DEFAULTS, CollBenchArgs, ContractError, ProfileArgs, RankArgs
from testbed import perfmodel as pm
from testbed.config import Trial


def test_trial_defaults_have_one_home():
    """Trial, RankArgs, `testbed run`'s flags and the sweep loader (through Trial) read runners.contract."""
    from testbed.trial_args import TRIAL_FLAG_DEFAULTS, add_trial_flags

    trial = {f.name: f.default for f in dataclasses.fields(Trial)}
    rank = {f.name: f.default for f in dataclasses.fields(RankArgs)}
    p = argparse.ArgumentParser()
    add_trial_flags(p)
    flags = vars(p.parse_args([]))
    for key, value in dataclasses.asdict(TRAINING_DEFAULTS).items():
        assert trial[key] == value, key
        assert TRIAL_FLAG_DEFAULTS[key] == value, key
        assert flags[key] == value, key
        if key in rank and key != "model":  # a rank is always told its workload
            assert rank[key] == value, key
    assert TRAINING_DEFAULTS.image_size == catalog.DEFAULT_IMAGE_SIZE
    assert TRAINING_DEFAULTS.seq_len == catalog.DEFAULT_SEQ_LEN


def test_demo_runs_the_default_warm_up():
    """`make demo` warned about its own trial while its warm-up differed from the default; it sets none now."""
    from testbed import demo

    assert "--warmup-iters" not in demo.TRIAL and "--image-size" not in demo.TRIAL


def test_compressor_names_and_baselines_come_from_the_catalogue():
    assert pm.COMPRESSORS == tuple(catalog.names())
    assert pm.BASELINES == catalog.DENSE_BASELINES == ("syncsgd", "fp16", "bf16")
    assert list(pm.SYNTHETIC_CODECS) == catalog.names()
    for name, (collective, rounds, *_costs) in pm.SYNTHETIC_CODECS.items():
        assert (collective, rounds) == (catalog.COMPRESSORS[name].collective, catalog.COMPRESSORS[name].rounds)


def test_unshaped_is_said_and_read_in_one_place():
    from shaping.units import is_unshaped, rate_or_unshaped

    assert is_unshaped("none") and is_unshaped(" Unshaped ") and not is_unshaped("0") and not is_unshaped(None)
    assert rate_or_unshaped(None) == rate_or_unshaped(0) == "unshaped"
    assert rate_or_unshaped(1e9) == "1gbit" and rate_or_unshaped(1.234e9, 3) == "1.23gbit"


def test_collbench_args_carry_the_probe_length():
    """`testbed calibrate --probe-s` reaches the ranks; out of range is refused by the rank as by the controller."""
    args = CollBenchArgs("out.json", (1024, 4096), probe_s=0.5)
    assert CollBenchArgs.from_argv(args.to_argv()) == args
    assert CollBenchArgs("out.json", (1024, 4096)).probe_s == DEFAULT_PROBE_S
    for bad in ("0", "-1", "nan", "61"):
        with pytest.raises(ContractError, match="--probe-s"):
            CollBenchArgs.from_argv([*args.to_argv()[:-2], "--probe-s", bad])


def test_profile_args_carry_a_codecs_only_lockstep_launch():
    """measure_lockstep's per-compressor launches reach the processes as codecs only (no compute phase first)."""
    args = ProfileArgs(model="mlp", batch_size=4, out="p.json", compressors=("acpsgd",), lockstep_rank=1,
                       lockstep_world=2, init_method="file:///tmp/x/store", lockstep_codecs_only=True)  # fmt: skip
    back = ProfileArgs.from_argv(args.to_argv())
    assert back.lockstep_codecs_only and back.compressors == ("acpsgd",) and back.lockstep_rank == 1
    assert not ProfileArgs.from_argv(dataclasses.replace(args, lockstep_codecs_only=False).to_argv()).lockstep_codecs_only
