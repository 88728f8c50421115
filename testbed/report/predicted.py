"""The performance model's side of the report: how it predicts (ModelSettings: latency, efficiency, hook mode and
the calibrations to pick from), the network and crossover terms of a group of workers, each configuration's predicted
against measured iteration time (`prediction_errors`), and the efficiency that makes sync SGD's predictions match its
trials. Pure pandas: no plotting, no output files; the verdicts on crossovers are in analysis.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from testbed import perfmodel as pm
from testbed.report.analysis import fmt_rate, variant_profile


@dataclass(frozen=True)
class ModelSettings:
    """How the report predicts: latency / efficiency given on the command line (None: the calibration's, else the
    defaults), the hook mode, and the calibrations to pick from per world size (calibration.terms_for: one, or
    several rates interpolated between)."""

    latency_s: float | None = None
    efficiency: float | None = None
    hook_blocks_backward: bool = True
    calibrations: tuple[pm.Calibration, ...] = ()

    def terms(self, world_size: int, cross_traffic: int = 0) -> pm.ModelTerms | pm.TermsByRate:
        """`cross_traffic` N > 0: the terms of calibrations measured beside N flows (the defaults without one: ask
        `calibrated_beside` first)."""
        return pm.terms_for(self.calibrations, int(world_size), latency_s=self.latency_s, efficiency=self.efficiency,
                            cross_traffic=int(cross_traffic))  # fmt: skip

    def calibrated_beside(self, world_size: int, cross_traffic: int) -> bool:
        """Whether a calibration measured beside `cross_traffic` flows is there for `world_size` ranks."""
        return bool(pm.pick_calibrations(self.calibrations, int(world_size), cross_traffic=int(cross_traffic)))


def _delay(delay_s) -> float:
    return 0.0 if delay_s is None or (isinstance(delay_s, float) and math.isnan(delay_s)) else float(delay_s)


def network(ws: int, bps: float, delay_s: float, s: ModelSettings, cross_traffic: int = 0) -> pm.Network:
    return s.terms(ws, cross_traffic).network(int(ws), float(bps), _delay(delay_s))


def crossover_terms(ws: int, delay_s: float, s: ModelSettings) -> pm.Terms:
    """The collective terms of `pm.crossover` for a group of `ws` workers (trial delay added to the latency)."""
    return s.terms(ws).function(int(ws), _delay(delay_s))


def effective_rate(rate_bps: float, goodput_bps: float | None) -> float:
    """The rate a point stands at: the shaped rate, or for an unshaped trial its measured (iperf3) goodput; 0 when
    neither is known (the point then takes no part in a crossover)."""
    if rate_bps and rate_bps > 0:
        return float(rate_bps)
    if goodput_bps is None or (isinstance(goodput_bps, float) and math.isnan(goodput_bps)):
        return 0.0
    return float(goodput_bps)


def predicted_iteration(profiles: Sequence[pm.Profile], s: ModelSettings, model: str, batch_size, world_size,
                        variant: str, compressor: str, bps: float, delay_s,
                        cross_traffic: int = 0) -> tuple[pm.Prediction, pm.Profile] | None:  # fmt: skip
    """The model's iteration for one configuration at `bps` (the closest profile of the model; None without one, or
    when it lacks the compressor), and the profile it used; beside `cross_traffic` flows with the terms calibrated
    beside as many (ModelSettings.calibrated_beside)."""
    prof = pm.pick_profile(profiles, model, int(batch_size), int(world_size))
    if prof is None or compressor not in prof.compressor_names():
        return None
    return pm.predict_iteration(
        variant_profile(prof, variant),
        compressor,
        network(world_size, bps, delay_s, s, cross_traffic),
        hook_blocks_backward=s.hook_blocks_backward,
        comm_rel_spread=s.terms(int(world_size), cross_traffic).comm_rel_spread,
    ), prof


def prediction_errors(agg: pd.DataFrame, profiles: Sequence[pm.Profile], s: ModelSettings) -> pd.DataFrame:
    """Per configuration of `aggregate` (model, batch, workers, variant, rate): predicted vs measured iteration time,
    the measured one the median over the configuration's ok trials (repeats pooled, as the speedups are; unshaped
    ones are predicted at their median measured goodput). `trials` says how many were pooled, `trial_id` names the
    first. `error_at_trial_compute_pct` splits an error: it is the error the prediction would have had with the
    trials' own compute (`measured_compute_ms`, forward + backward + optimizer, the mean over their ranks) in place
    of the profile's (`profile_compute_ms`), so what remains comes from the terms above compute. The trials count as
    compute whatever slowed their backward (a collective's host work beside it, a co-located peer), so this is a
    split of the error, not a measurement of one term."""
    rows = []
    for _, r in agg.iterrows():
        bps = r["rate_bps"] if r["rate_bps"] > 0 else r.get("goodput_bps")
        if not bps or (isinstance(bps, float) and math.isnan(bps)):
            continue
        predicted = predicted_iteration(profiles, s, r["model"], r["batch_size"], r["world_size"], r["variant"],
                                        r["compressor"], bps, r["delay_s"])  # fmt: skip
        if predicted is None:
            continue
        full, prof = predicted
        terms = s.terms(int(r["world_size"]))
        pred = full.iter_time_s
        measured_compute = float(r["forward_s"] + r["backward_s"] + r["optimizer_s"])  # nan without phases
        rows.append(
            {
                "trial_id": r["trial_id"],
                "model": r["model"],
                "batch_size": int(r["batch_size"]),
                "world_size": int(r["world_size"]),
                "bandwidth": fmt_rate(r["rate_bps"]),
                "compressor": r["variant"],
                "trials": int(r["trials"]),
                "measured_ms": r["t_s"] * 1e3,
                "predicted_ms": pred * 1e3,
                "error_pct": (pred - r["t_s"]) / r["t_s"] * 100,
                # issue 32: what bound the prediction, its interval, extrapolated beyond the calibrated rates
                "bound_by": full.bound_by,
                "low_ms": (full.low_s or pred) * 1e3,
                "high_ms": (full.high_s or pred) * 1e3,
                "extrapolated": terms.extrapolated(float(bps)),
                "profile_colocated_ranks": prof.colocated_ranks,
                # where an error comes from: the trials' own forward + backward + optimizer against the profile's,
                # and the error had the prediction's compute been the trials' own (what is left is the terms on top
                # of compute: communication, codec, host cost, skew, floor)
                "measured_compute_ms": measured_compute * 1e3,
                "profile_compute_ms": prof.compute_s * 1e3,
                "error_at_trial_compute_pct": (pred - prof.compute_s + measured_compute - r["t_s"]) / r["t_s"] * 100,
                # the backward phase split at the end of its compute: the trials' backward with its hooks' encodes,
                # and their waits and decodes after it; the composition's backward compute (slowed by the host share
                # of the collectives beside it) and what follows it, with the slowest rank's lateness
                "measured_backward_ms": float(r["backward_s"] + r["encode_s"]) * 1e3,
                "measured_after_backward_ms": float(r["comm_s"] + r["decode_s"]) * 1e3,
                "predicted_backward_ms": full.backward_compute_s * 1e3,
                "predicted_after_backward_ms": full.after_backward_s * 1e3,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "trial_id",
            "model",
            "batch_size",
            "world_size",
            "bandwidth",
            "compressor",
            "trials",
            "measured_ms",
            "predicted_ms",
            "error_pct",
            "bound_by",
            "low_ms",
            "high_ms",
            "extrapolated",
            "profile_colocated_ranks",
            "measured_compute_ms",
            "profile_compute_ms",
            "error_at_trial_compute_pct",
            "measured_backward_ms",
            "measured_after_backward_ms",
            "predicted_backward_ms",
            "predicted_after_backward_ms",
        ],
    )


def fit_efficiency_from_trials(
    ok: pd.DataFrame, profiles: Sequence[pm.Profile], s: ModelSettings
) -> tuple[float | None, int]:
    """Efficiency that makes predicted syncsgd iteration times match the measured ones (median over trials).

    Uses shaped syncsgd trials whose prediction at efficiency 1 is communication-bound (exposed time at least half
    the iteration), so compute noise does not masquerade as bandwidth. Returns (efficiency or None, trials used).
    """
    fits = []
    s1 = replace(s, efficiency=1.0)
    picked = ok[(ok["variant"] == "syncsgd") & (ok["rate_bps"] > 0)]
    for _, r in picked.iterrows():
        prof = pm.pick_profile(profiles, r["model"], int(r["batch_size"]), int(r["world_size"]))
        if prof is None or int(r["world_size"]) < 2:
            continue

        def t(eff: float, r=r, prof=prof) -> float:
            net = network(r["world_size"], r["rate_bps"], r["delay_s"], replace(s, efficiency=eff))
            return pm.predict_iteration(prof, "syncsgd", net, hook_blocks_backward=s1.hook_blocks_backward).iter_time_s

        full = pm.predict_iteration(prof, "syncsgd", network(r["world_size"], r["rate_bps"], r["delay_s"], s1))
        if full.exposed_s < 0.5 * full.iter_time_s:
            continue
        if r["t_s"] <= full.iter_time_s:
            fits.append(1.0)
            continue
        lo, hi = 1e-4, 1.0  # t(eff) decreases with eff
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if t(mid) < r["t_s"] else (mid, hi)
        fits.append(0.5 * (lo + hi))
    if not fits:
        return None, 0
    return float(np.median(fits)), len(fits)
