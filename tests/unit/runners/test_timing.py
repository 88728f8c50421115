"""runners.train input validation (in-process: no process group is ever created) and phase arithmetic."""

from __future__ import annotations

import pytest

from runners import contract, train
from runners.timing import Clock, CommStats

ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


@pytest.fixture
def torchrun_env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "nope", "--out", "x"], "unknown model 'nope'; valid: resnet18, resnet50"),
        (["--model", "mlp", "--compressor", "zip", "--out", "x"], "unknown compressor 'zip'; valid: syncsgd"),
        (["--model", "mlp", "--compressor", "powersgd", "--opt", "rank=0", "--out", "x"], "powersgd rank 0"),
        (["--model", "mlp", "--compressor", "powersgd", "--opt", "rank=-3", "--out", "x"], "powersgd rank -3"),
        (["--model", "mlp", "--compressor", "topk", "--opt", "ratio=0", "--out", "x"], "topk ratio 0 is outside"),
        (["--model", "mlp", "--compressor", "topk", "--opt", "rank=2", "--out", "x"],
         "option 'rank' does not apply to topk; topk accepts: ratio, error_feedback"),
        (["--model", "mlp", "--compressor", "powersgd", "--opt", "start_iter=1", "--out", "x"], "start_iter 1"),
        (["--model", "mlp", "--batch-size", "0", "--out", "x"], "--batch-size 0 is not accepted"),
        (["--model", "mlp", "--iters", "0", "--out", "x"], "--iters 0"),
        (["--model", "mlp", "--opt", "junk", "--out", "x"], "'junk' is not KEY=VALUE"),
        (["--model", "mlp", "--iface", "nosuchif0", "--out", "x"], "--iface 'nosuchif0' does not exist"),
        (["--model", "mlp"], "required: --out"),
    ],
)
def test_bad_input_is_one_line_exit_2(torchrun_env, capsys, args, needle):
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error: ") and needle in err[0], err


def test_bad_rank_env(monkeypatch, capsys):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RANK", "2")
    assert train.main(["--model", "mlp", "--out", "x"]) == 2
    assert "RANK=2 WORLD_SIZE=2" in capsys.readouterr().err


def test_opt_values_are_typed():
    assert contract.parse_value("4") == 4 and contract.parse_value("0.5") == 0.5
    assert contract.parse_value("true") is True and contract.parse_value("False") is False
    assert contract.parse_value("abc") == "abc"


def test_percentile():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert train.percentile(xs, 0.5) == 3.0 and train.percentile(xs, 0.0) == 1.0
    assert train.percentile(xs, 0.95) == pytest.approx(4.8)


def test_overlapped_phases_partition_the_backward_wall_time():
    """Synchronous hook work is carved out of backward; the tail after the last hook is exposed comm."""
    clock = Clock("cpu")
    stats = CommStats(clock)
    t0, t1 = 0.0, 1.0  # forward 1 s
    # hook of one bucket at 1.5..1.9: encode 0.1, comm wait 0.2, decode 0.1; last grad at 2.5; backward ends 3.0
    stats.intervals = [("encode", 0, 1.5, 1.6, True), ("comm", 0, 1.6, 1.8, True), ("decode", 0, 1.8, 1.9, True)]
    stats.hook_end = 1.9
    ph = train.step_phases(clock, stats, False, t0, t1, 3.0, 3.0, 3.25, 2.5)
    assert ph["forward_s"] == pytest.approx(1.0)
    assert ph["encode_s"] == pytest.approx(0.1) and ph["decode_s"] == pytest.approx(0.1)
    assert ph["comm_s"] == pytest.approx(0.2 + 0.5)  # in-hook wait + tail after the last gradient
    assert ph["backward_s"] == pytest.approx(2.0 - 0.4 - 0.5)
    assert ph["optimizer_s"] == pytest.approx(0.25)
    assert sum(ph.values()) == pytest.approx(3.25)


def test_async_decode_hidden_under_backward_is_not_counted():
    clock = Clock("cpu")
    stats = CommStats(clock)
    stats.intervals = [("encode", 0, 1.1, 1.2, True), ("decode", 0, 1.5, 1.6, False),  # hidden
                       ("decode", 1, 2.8, 2.9, False)]  # during the tail: exposed  # fmt: skip
    stats.hook_end = 2.0
    ph = train.step_phases(clock, stats, False, 0.0, 1.0, 3.0, 3.0, 3.0, 2.5)
    assert ph["decode_s"] == pytest.approx(0.1)
    assert ph["comm_s"] == pytest.approx(0.5 - 0.1)
    assert sum(ph.values()) == pytest.approx(3.0)


def test_serial_reduction_counts_decode_beside_encode_once():
    """--serial: bucket 0 decodes on the communication thread (2.3..2.6) while bucket 1 encodes (2.2..2.5); the
    overlap is encode, the decode outside it is decode, and the waits with no codec work are comm. (Subtracting
    both sums from the window, as before, gave comm 0 here.)"""
    clock = Clock("cpu")
    stats = CommStats(clock)
    stats.intervals = [("encode", 0, 2.0, 2.2, True), ("comm", 0, 2.2, 2.3, False),
                       ("encode", 1, 2.2, 2.5, True), ("decode", 0, 2.3, 2.6, False),
                       ("decode", 1, 2.7, 2.75, False)]  # fmt: skip
    ph = train.step_phases(clock, stats, True, 0.0, 1.0, 2.0, 2.8, 3.0, None)
    assert ph["backward_s"] == pytest.approx(1.0)
    assert ph["encode_s"] == pytest.approx(0.5)
    assert ph["decode_s"] == pytest.approx(0.1 + 0.05)
    assert ph["comm_s"] == pytest.approx(0.8 - 0.5 - 0.15)  # 2.6..2.7 and 2.75..2.8
    assert sum(ph.values()) == pytest.approx(3.0)


def test_lockstep_skew_is_the_slowest_rank_minus_the_median_per_step():
    from runners.timing import lockstep_skew

    # three ranks, two steps: rank 2 late by 30 ms in the first, rank 0 by 5 ms in the second
    per_rank = [[0.100, 0.105], [0.100, 0.100], [0.130, 0.100]]
    assert lockstep_skew(per_rank) == pytest.approx([0.030, 0.005])


def test_a_jobs_step_is_the_slowest_ranks_step_by_step():
    from runners.timing import slowest_rank_steps

    per_rank = [[0.100, 0.105, 0.300], [0.100, 0.100], [0.130, 0.100]]  # rank 0 measured a step more
    assert slowest_rank_steps(per_rank) == pytest.approx([0.130, 0.105])  # only the steps every rank has


def test_settle_ratio_is_the_first_two_steps_over_the_last_two():
    from runners.timing import settle_ratio

    assert settle_ratio([2.4, 2.5, 1.9, 1.6, 1.5, 1.4]) == pytest.approx(4.9 / 2.9)  # still warming up
    assert settle_ratio([1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert settle_ratio([1.0, 1.0, 1.0]) is None  # too few steps to tell


def test_profiles_measure_at_least_two_seconds_of_short_steps():
    from runners.profile import MAX_MEASURED_STEPS, measured_steps

    assert measured_steps(10, 0.5) == 10  # 5 s already
    assert measured_steps(10, 0.04) == 50  # a 40 ms step: 2 s
    assert measured_steps(10, 1e-6) == MAX_MEASURED_STEPS
    assert measured_steps(10, 0.0) == 10


def test_last_grad_marks_hold_the_mark_of_the_last_gradient_of_each_backward():
    import torch

    from runners.timing import last_grad_marks

    class Counter(Clock):
        def __init__(self):
            super().__init__("cpu")
            self.n = 0

        def now(self):
            self.n += 1
            return self.n

    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    module[0].bias.requires_grad_(False)  # frozen parameters are not marked
    clock = Counter()
    box = last_grad_marks(module, clock)
    assert box == [None]
    module(torch.ones(2, 3)).sum().backward()
    assert box[0] == 3  # one mark per trainable parameter, the last one kept
    box[0] = None
    module(torch.ones(2, 3)).sum().backward()
    assert box[0] == 6
