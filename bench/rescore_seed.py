"""Score a held-out seed's stored trials again, with this checkout's model and a chosen subset of its profile launches.

A seed is scored once, by the model it was frozen at (`bench/model_accuracy.py --seed-table`); that is its result.
This tool is for what comes after: finding out why a configuration missed (which profile launch moved it) and what a
change would have done on trials already measured. Figures from it are tuning data, never a held-out result (a fix is
judged on a new seed; docs/performance-model.md, "Held-out validation").

    python bench/rescore_seed.py DIR                       # every finished configuration, every launch pooled
    python bench/rescore_seed.py DIR --launches '*-rep2*'  # only the second repetition's profile launches
    python bench/rescore_seed.py DIR --configs 7 --rows    # one configuration, every setting
    python bench/rescore_seed.py DIR --without acpsgd     # every setting but ACP-SGD's
    python bench/rescore_seed.py DIR --configs 4 --split   # each setting's backward and what follows it, both sides

DIR is a seed's --out folder (e.g. unpacked from bench/holdout_runs/seed<SEED>.tar.xz). With PYTHONPATH set to a
clone at another commit (the seed's frozen one: `git clone . /tmp/c && git -C /tmp/c checkout COMMIT`), that model
scores them instead. The predictions are the report's (`testbed report --overlap-hooks`, as the bench runs it), over the trials' medians, with the calibrations
stored beside the profiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # after PYTHONPATH: `PYTHONPATH=CLONE` scores with a clone's model (the frozen one)


def config_dirs(seed_dir: Path, wanted: set[int] | None) -> list[Path]:
    """The finished configurations' folders (their report written), in order."""
    found = [d for d in seed_dir.glob("config*") if d.is_dir() and d.name[6:].isdigit()]
    return [d for d in sorted(found, key=lambda d: int(d.name[6:]))
            if (d / "report" / "prediction_error.csv").is_file() and (wanted is None or int(d.name[6:]) in wanted)]  # fmt: skip


def rescore(config: Path, launches: str):
    """The report's prediction errors for one configuration, its profiles pooled over the launch folders that match
    `launches` (None when none matches)."""
    from model_accuracy import launch_profiles  # bench/ is this script's folder: first on sys.path

    from testbed import perfmodel as pm
    from testbed.report import load_results_dir
    from testbed.report.analysis import aggregate, check_results
    from testbed.report.predicted import ModelSettings, prediction_errors

    groups = launch_profiles(sorted((config / "profiles").glob(launches)))
    if not groups:
        return None
    pooled = [pm.pool_profiles(g) for g in groups.values()]
    ok, _, _ = check_results(load_results_dir(config / "results"))
    settings = ModelSettings(None, None, False, tuple(pm.find_calibrations(config / "profiles")))
    return prediction_errors(aggregate(ok), pooled, settings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed_dir", type=Path, help="a seed's --out folder")
    ap.add_argument("--launches", default="*hosts-rep*",
                    help="glob of the profile launch folders to pool (default: every one, as the bench does)")  # fmt: skip
    ap.add_argument("--configs", default="", help="comma-separated configuration numbers (default: every finished one)")
    ap.add_argument("--rows", action="store_true", help="print every setting's measured and predicted time")
    ap.add_argument("--split", action="store_true",
                    help="print every setting's backward phase split at the end of its compute, measured and predicted "
                    "(backward with its hooks' encodes; the waits, decodes and slowest rank's lateness after it)")
    ap.add_argument("--without", default="", help="comma-separated compressors whose settings are left out")
    args = ap.parse_args(argv)
    try:
        wanted = {int(x) for x in args.configs.split(",") if x.strip()} or None
    except ValueError:
        print(f"rescore_seed.py: --configs {args.configs!r}: expected comma-separated integers", file=sys.stderr)
        return 2
    configs = config_dirs(args.seed_dir, wanted)
    if not configs:
        print(f"rescore_seed.py: {args.seed_dir}: no finished configuration (config<N>/report/prediction_error.csv); "
              "expected a seed's --out folder", file=sys.stderr)  # fmt: skip
        return 2
    every: list[float] = []
    for config in configs:
        errors = rescore(config, args.launches)
        if errors is None:
            print(f"{config.name}: no profile launch matches {args.launches!r}")
            continue
        errors = errors[~errors["compressor"].isin(args.without.split(","))]
        err = errors["error_pct"].abs()
        every += list(err)
        at_own = errors["error_at_trial_compute_pct"].abs()
        print(f"{config.name}: {len(err)} predictions, median |error| {err.median():.1f} %, worst {err.max():.1f} %; "
              f"with the trials' own compute: median {at_own.median():.1f} %, worst {at_own.max():.1f} %")
        if args.rows:
            cols = ["bandwidth", "compressor", "measured_ms", "predicted_ms", "error_pct", "bound_by",
                    "measured_compute_ms", "profile_compute_ms", "error_at_trial_compute_pct"]  # fmt: skip
            print(errors[cols].round(1).to_string(index=False))
        if args.split:
            cols = ["bandwidth", "compressor", "measured_ms", "predicted_ms", "error_pct", "bound_by",
                    "measured_backward_ms", "predicted_backward_ms", "measured_after_backward_ms",
                    "predicted_after_backward_ms"]  # fmt: skip
            print(errors[cols].round(1).to_string(index=False))
    if every:
        print(f"all: {len(every)} predictions, median |error| {statistics.median(every):.1f} %, worst {max(every):.1f} %,"
              f" {sum(e > 15 for e in every)} over 15 %")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
