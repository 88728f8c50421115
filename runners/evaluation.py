"""The learning side of a trial: training time, evaluation every N steps, the curve, the stop at a target accuracy.

``Learning.after_step`` is called once per training step (warm-up included: every step trains the model) with the
step's wall time and loss. It keeps the training time (the sum of step times; evaluation runs between steps and its
time is kept apart, never in the training time), evaluates every ``eval_every`` steps and after the last step
(runners/data.py: sharded over the ranks and summed), and says when to stop: the first evaluation at or above the
target accuracy gives ``steps_to_target`` and ``train_time_to_target_s``. Every rank sees the same summed accuracy, so
every rank stops at the same step without another collective. A trial that never reaches the target is a result
(``reached_target`` false), not a failure.

A curve point: {"step", "train_time_s", "train_loss" (mean over all ranks of the steps since the previous point),
"test_loss", "test_accuracy", "eval_s", "eval_samples"}.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class Learning:
    def __init__(self, *, module: torch.nn.Module, source, eval_every: int | None, target: float | None,
                 rank: int, world_size: int, device: torch.device, min_measured: int = 2) -> None:  # fmt: skip
        self.module, self.source, self.eval_every, self.target = module, source, eval_every, target
        self.rank, self.world, self.device = rank, world_size, device
        self.min_measured = min_measured  # a target reached in warm-up still leaves steps to time
        self.train_time_s = 0.0
        self.eval_time_s = 0.0
        self.curve: list[dict[str, Any]] = []
        self.steps_to_target: int | None = None
        self.train_time_to_target_s: float | None = None
        self.counts: list[int] = []
        self.steps = 0
        self.step_times_s: list[float] = []  # this rank's; the summary takes the slowest rank's per step
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # no host sync per step
        self._loss_n = 0

    @property
    def evaluates(self) -> bool:
        return self.source is not None and self.eval_every is not None

    def after_step(self, step: int, iter_time_s: float, loss: torch.Tensor, *, measured: int, last: bool) -> bool:
        """Account step `step` (0-based); True when training should stop (target reached)."""
        self.steps = step + 1
        self.train_time_s += iter_time_s
        self.step_times_s.append(iter_time_s)
        self._loss_sum += loss.detach().to(torch.float64)
        self._loss_n += 1
        if self.evaluates and (self.steps % self.eval_every == 0 or last):
            self._evaluate()
        return self.steps_to_target is not None and measured >= self.min_measured

    def finish(self) -> None:
        """Evaluate after the last step if that step was not evaluated (an early stop waits for measured steps)."""
        if self.evaluates and (not self.curve or self.curve[-1]["step"] != self.steps):
            self._evaluate()

    def _evaluate(self) -> None:
        import torch.distributed as dist

        from runners.data import evaluate

        t0 = time.perf_counter()
        train = torch.stack([self._loss_sum, torch.tensor(float(self._loss_n), dtype=torch.float64,
                                                          device=self.device)])  # fmt: skip
        dist.all_reduce(train)
        result = evaluate(self.module, self.source, rank=self.rank, world_size=self.world, device=self.device)
        dt = time.perf_counter() - t0
        self.eval_time_s += dt
        self._loss_sum.zero_()
        self._loss_n = 0
        self.counts = result["counts"]
        acc = result["test_accuracy"]
        self.curve.append({
            "step": self.steps, "train_time_s": self.train_time_s,
            "train_loss": float(train[0] / train[1]) if float(train[1]) else None,
            "test_loss": result["test_loss"], "test_accuracy": acc, "eval_s": dt, "eval_samples": sum(self.counts),
        })  # fmt: skip
        if self.target is not None and self.steps_to_target is None and acc >= self.target:
            self.steps_to_target, self.train_time_to_target_s = self.steps, self.train_time_s

    def summary(self, data: str, ranks_step_times_s: list[list[float]] | None = None) -> dict[str, Any]:
        """The summary.json keys of runners.contract.SUMMARY_ACCURACY. With every rank's step times, training times
        are the job's: per step the slowest rank's (as the iteration time statistics are, so that steps x the mean
        iteration time of a throughput run composes with them like for like)."""
        if ranks_step_times_s:
            from runners.timing import slowest_rank_steps

            per_step = slowest_rank_steps(ranks_step_times_s)
            elapsed = [0.0]
            for t in per_step:
                elapsed.append(elapsed[-1] + t)
            self.train_time_s = elapsed[-1]
            for p in self.curve:
                p["train_time_s"] = elapsed[p["step"]]
            if self.steps_to_target is not None:
                self.train_time_to_target_s = elapsed[self.steps_to_target]
        last = self.curve[-1] if self.curve else {}
        return {
            "data": data,
            "steps_run": self.steps,
            "train_time_s": self.train_time_s,
            "eval_time_s": self.eval_time_s if self.evaluates else None,
            "eval_samples": sum(self.counts) if self.counts else None,
            "eval_counts_per_rank": self.counts or None,
            "final_test_loss": last.get("test_loss"),
            "final_test_accuracy": last.get("test_accuracy"),
            "reached_target": (self.steps_to_target is not None) if self.target is not None else None,
            "steps_to_target": self.steps_to_target,
            "train_time_to_target_s": self.train_time_to_target_s,
            "curve": self.curve or None,
        }
