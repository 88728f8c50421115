"""The torch-free catalogue (runners/catalog.py) agrees with the state classes the ranks build, and stays torch-free."""

import inspect
import math
import subprocess
import sys

import pytest
from conftest import REPO

from runners import catalog
from runners import compressors as comp


@pytest.mark.parametrize("name", catalog.names())
def test_catalogue_matches_state_class(name):
    state = comp._MODULES[name].STATE
    entry = catalog.compressor(name)
    assert entry.option_names == state.HYPERPARAMS
    assert entry.collective == state.COLLECTIVE
    assert entry.rounds == state.ROUNDS
    params = inspect.signature(state.__init__).parameters
    assert entry.defaults == {k: params[k].default for k in state.HYPERPARAMS}
    assert entry.overlaps is True


def test_names_and_options_of_read_the_catalogue():
    assert comp.names() == catalog.names() == list(comp._MODULES)
    assert comp.options_of("topk") == ("ratio", "error_feedback")
    with pytest.raises(ValueError, match="unknown compressor 'zip'"):
        comp.options_of("zip")


BAD = [
    ("powersgd", {"rank": 0}),
    ("powersgd", {"rank": 2.5}),
    ("powersgd", {"rank": True}),
    ("powersgd", {"start_iter": -1}),
    ("powersgd", {"start_iter": 1}),
    ("powersgd", {"min_compression_rate": -0.5}),
    ("powersgd", {"min_compression_rate": math.nan}),
    ("powersgd", {"error_feedback": "yes"}),
    ("powersgd", {"seed": -3}),
    ("acpsgd", {"start_iter": 1}),
    ("acpsgd", {"rank": 0}),
    ("topk", {"ratio": 0}),
    ("topk", {"ratio": 2}),
    ("topk", {"ratio": math.nan}),
    ("topk", {"ratio": math.inf}),
    ("mstopk", {"ratio": -0.1}),
    ("mstopk", {"samplings": 0}),
    ("signsgd", {"error_feedback": 1}),
    ("syncsgd", {"builtin": "off"}),
    ("topk", {"rank": 4}),
    ("fp16", {"ratio": 0.1}),
]


@pytest.mark.parametrize(("name", "options"), BAD, ids=[f"{n}-{o}" for n, o in BAD])
def test_bad_values_refused_with_the_state_class_message(name, options):
    with pytest.raises(ValueError) as from_state:
        comp.get(name, **options)
    with pytest.raises(ValueError) as from_catalogue:
        catalog.check_options(name, options)
    assert str(from_catalogue.value) == str(from_state.value)
    assert "\n" not in str(from_catalogue.value)


GOOD = [
    ("powersgd", {"rank": 1, "start_iter": 0, "error_feedback": False, "warm_start": False}),
    ("powersgd", {"min_compression_rate": 0, "seed": 7}),
    ("acpsgd", {"rank": 8, "start_iter": 2}),
    ("topk", {"ratio": 1}),
    ("topk", {"ratio": 1e-6, "error_feedback": False}),
    ("mstopk", {"samplings": 1}),
    ("syncsgd", {"builtin": False}),
    ("bf16", {}),
]


@pytest.mark.parametrize(("name", "options"), GOOD, ids=[f"{n}-{o}" for n, o in GOOD])
def test_good_values_accepted_by_both(name, options):
    state, _ = comp.get(name, **options)
    checked = catalog.check_options(name, options)
    assert checked == {k: getattr(state, k) for k in options}


def test_option_flags_cover_the_shared_flags():
    flags = catalog.option_flags()
    assert flags["rank"] == ("--rank", "int")
    assert flags["ratio"] == ("--ratio", "float")
    assert flags["error_feedback"] == ("--error-feedback", "bool")
    assert "seed" not in flags  # --seed is the trial's seed; the compressor seed is set in sweep files
    assert catalog.who_accepts("ratio") == ["topk", "mstopk"]


def test_models_match_the_runner():
    from runners import models

    assert models.MODELS == catalog.MODEL_NAMES
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        catalog.check_model("nope")


@pytest.mark.parametrize("module", ["runners.catalog", "testbed.config"])
def test_import_does_not_load_torch(module):
    code = f"import {module}, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
