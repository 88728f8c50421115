"""`testbed crossover`'s work: aim with the model, run the trials the search asks for, reuse the stored ones.

For each compressor: the model's predicted crossover (a profile beside the results, measured first when absent;
the calibration stored there, else the model's defaults) is the first guess; then testbed/crossover_search.py says
which rate to measure next. Every measurement is an ordinary trial (`launch.run_trial`: same ids, same store, the
report draws it); a trial stored ok is never run again, so a stopped search resumes where it stopped. Repeats at a
close rate are the same trial with seeds seed+1, seed+2, ... (the report pools them as repeats). Each search's
rates, outcomes and answer are kept in `<results>/searches/<name>.json`, which the report marks on its curves.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shaping.files import atomic_write
from shaping.units import format_rate
from testbed import crossover_search as cs
from testbed import launch_plan
from testbed.config import Trial
from testbed.errors import InputError, LaunchError

SEARCHES_DIR = "searches"
Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Aim:
    """The model's first guess for one compressor: its predicted crossover in the range and where it came from."""

    kind: str | None  # crossover | always | never (perfmodel.Crossover); None: no prediction
    bandwidth_bps: float | None
    source: str


def profile_for(trial: Trial, names: list[str], profiles_dir: Path, *, measure: bool, say: Say):
    """The stored profile of the trial's model and batch size with every compressor in `names`, else (with
    `measure`) one measured now and stored in `profiles_dir` (said so); InputError naming what is missing otherwise."""
    from testbed.perfmodel import find_profiles, pick_profile

    found = [p for p in (find_profiles(profiles_dir) if profiles_dir.is_dir() else [])
             if p.model == trial.model and set(names) <= set(p.compressor_names())]  # fmt: skip
    prof = pick_profile(found, trial.model, trial.batch_size, trial.world_size)
    if prof is not None:
        return prof, f"{profiles_dir} ({prof.model} bs{prof.batch_size})"
    if not measure:
        raise InputError(
            f"--no-measure: no profile of {trial.model} with {', '.join(names)} in {profiles_dir}; run `testbed "
            f"profile --model {trial.model} --batch-size {trial.batch_size} --out {profiles_dir}` or drop --no-measure"
        )
    from testbed.cluster.base import shared_cpu_threads
    from testbed.modelling import measure_and_store
    from testbed.outputs import check_output_dir

    check_output_dir(profiles_dir, "--profiles")
    say(f"no profile of {trial.model} bs{trial.batch_size} with {', '.join(names)} in {profiles_dir}: measuring one")
    threads = shared_cpu_threads(trial.world_size)
    prof, path = measure_and_store(trial.model, trial.batch_size, names, "cpu", profiles_dir,
                                   image_size=trial.image_size, seq_len=trial.seq_len,
                                   bucket_cap_mb=trial.bucket_cap_mb, threads=threads)  # fmt: skip
    return prof, f"{path} (measured now)"


def aim(trial: Trial, against: str, prof, source: str, profiles_dir: Path, low_bps: int, high_bps: int) -> Aim:
    """The model's crossover of `trial.compressor` against `against` in [low, high] (perfmodel.crossover)."""
    from testbed.modelling import resolve_terms
    from testbed.perfmodel import crossover

    terms = resolve_terms("auto", profiles_dir, trial.world_size)
    cx = crossover(prof, trial.compressor, trial.world_size, low_bps, high_bps, baseline=against,
                   terms=terms.function(trial.world_size), hook_blocks_backward=not trial.overlap)  # fmt: skip
    return Aim(cx.kind, cx.bandwidth_bps, f"{source}; calibration: {terms.source}")


def start_bps(a: Aim, low_bps: int, high_bps: int) -> float | None:
    """Where the search starts: the predicted crossover; the top of the range when the model says the compressor is
    always faster there, the bottom when never (the first trial then checks the model's answer)."""
    if a.kind == "crossover":
        return a.bandwidth_bps
    return {"always": float(high_bps), "never": float(low_bps)}.get(a.kind or "")


class Stored:
    """The ok runs of a results store by trial id, kept current as trials finish."""

    def __init__(self, store):
        df = store.load(missing_ok=True, warn=lambda _m: None)
        ok = df[df["status"] == "ok"]
        self.runs = {r.trial_id: cs.Run(r.iter_time_s_p50, r.iter_time_s_p5, r.iter_time_s_p95)
                     for r in ok.itertuples()}  # fmt: skip
        self.rates = sorted({int(r) for r in ok["rate_bps"] if r})

    def add(self, row: Mapping[str, Any]) -> None:
        self.runs[row["trial_id"]] = cs.Run(row["iter_time_s_p50"], row["iter_time_s_p5"], row["iter_time_s_p95"])
        if row["rate_bps"]:
            self.rates = sorted({*self.rates, int(row["rate_bps"])})


@dataclasses.dataclass
class Search:
    """One compressor's search: its trial template, the baseline's, the settings, and how many runs it started."""

    trial: Trial  # resolved, at some rate; rate and seed are replaced per run
    against: str
    settings: cs.Settings
    aim: Aim
    ran: int = 0
    answer: cs.Answer | None = None
    doc: dict[str, Any] = dataclasses.field(default_factory=dict)  # the last state written to searches/

    @property
    def label(self) -> str:
        return self.trial.compressor + "".join(f" {k}={v}" for k, v in self.trial.options)

    def run_trial_of(self, side: str, rate_bps: int, k: int) -> Trial:
        t = self.trial if side == "compressor" else self.trial.baseline(self.against)
        return dataclasses.replace(t, rate_bps=int(rate_bps), seed=self.trial.seed + k)

    def measured(self, stored: Stored) -> Mapping[int, cs.Point]:
        return _Points(self, stored)

    def known(self, stored: Stored) -> tuple[int, ...]:
        """Rates where both sides' first run is stored (a grid's, an earlier search's)."""
        return tuple(r for r in stored.rates if all(self.run_trial_of(side, r, 0).trial_id in stored.runs
                                                    for side in ("compressor", "baseline")))  # fmt: skip


class _Points(Mapping):
    """rate -> the runs stored at it (seeds seed, seed+1, ... until the first missing one), for next_step."""

    def __init__(self, search: Search, stored: Stored):
        self.search, self.stored = search, stored

    def _runs(self, side: str, rate: int) -> tuple[cs.Run, ...]:
        out = []
        for k in range(cs.MAX_POINTS):
            run = self.stored.runs.get(self.search.run_trial_of(side, rate, k).trial_id)
            if run is None:
                break
            out.append(run)
        return tuple(out)

    def __getitem__(self, rate: int) -> cs.Point:
        return cs.Point(int(rate), self._runs("compressor", rate), self._runs("baseline", rate))

    def __iter__(self):
        return iter(self.stored.rates)

    def __len__(self) -> int:
        return len(self.stored.rates)


def run_search(
    search: Search,
    cluster,
    store,
    stored: Stored,
    run: Callable[[Trial], dict[str, Any]],
    *,
    stopped: Callable[[], bool],
    say: Say,
) -> cs.Answer | None:
    """Step the search until it answers (returned; also written to searches/), or `stopped()` (None: every finished
    trial is stored, a rerun resumes). `run(trial)` runs one trial and returns its stored row."""
    while True:
        settings = dataclasses.replace(search.settings, known_bps=search.known(stored))
        step = cs.next_step(settings, search.measured(stored))
        write_search(store.root, search, step)
        if isinstance(step, cs.Answer):
            search.answer = step
            return step
        todo = [search.run_trial_of(side, step.rate_bps, k)
                for side, n in (("baseline", step.baseline_runs), ("compressor", step.compressor_runs))
                for k in range(n)]  # fmt: skip
        todo = [t for t in todo if t.trial_id not in stored.runs]
        for t in todo:
            if stopped():
                return None
            say(f"{search.label}: {t.compressor} @ {format_rate(t.rate_bps, 3)} seed {t.seed} "
                f"(about {step.trials_left} trials left in this search)")  # fmt: skip
            row = run(t)
            search.ran += 1
            if stopped():
                return None
            if row["status"] != "ok":
                raise LaunchError(f"{t.label()} (trial {t.trial_id}) {row['status']}: {row['error']}; the search "
                                  "cannot place the crossover without it (run the command again to retry it)")  # fmt: skip
            stored.add(row)


def search_path(root: Path, search: Search) -> Path:
    return Path(root) / SEARCHES_DIR / f"{search.trial.compressor}-{search.trial.trial_id}.json".replace(":", "_")


def write_search(root: Path, search: Search, step: cs.Measure | cs.Answer) -> Path:
    """The search's state as JSON (its rates, outcomes, bracket or answer): what the report marks on the curves."""
    doc = search.doc = search_doc(search, step)
    path = search_path(root, search)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(doc, indent=1) + "\n")


def search_doc(search: Search, step: cs.Measure | cs.Answer) -> dict[str, Any]:
    t, s = search.trial, search.settings
    doc: dict[str, Any] = {
        "compressor": t.compressor,
        "variant": search.label,
        "options": t.option_dict,
        "against": search.against,
        "model": t.model,
        "batch_size": t.batch_size,
        "world_size": t.world_size,
        "low_bps": s.low_bps,
        "high_bps": s.high_bps,
        "precision": s.precision,
        "repeats": s.repeats,
        "one_run_gap": s.one_run_gap,
        "predicted_kind": search.aim.kind,
        "predicted_bps": search.aim.bandwidth_bps,
        "model_source": search.aim.source,
        "visits": [dataclasses.asdict(v) for v in step.visits],
        "trials": sum(v.runs for v in step.visits),
        "trials_run_now": search.ran,
    }
    if isinstance(step, cs.Answer):
        doc.update(done=True, kind=step.kind, bracket_bps=[step.low_bps, step.high_bps],
                   estimate_bps=step.estimate_bps, wins_below=step.wins_below,
                   ratio=cs.prediction_ratio(search.aim.bandwidth_bps if search.aim.kind == "crossover" else None, step),
                   verdict=step.describe(search.label))  # fmt: skip
    else:
        doc.update(done=False, next_bps=step.rate_bps, bracket_bps=list(step.bracket) if step.bracket else None,
                   trials_left=step.trials_left)  # fmt: skip
    return doc


def find_crossovers(args, trials: list[Trial], settings: cs.Settings, profiles_dir: Path, *, say: Say):
    """`testbed crossover`: under the cluster's lease, one search per compressor (the trial flags in `args`, as
    `sweep` takes them); returns (exit status, the searches). Bad input and a missing profile with --no-measure are
    InputErrors before any trial runs."""
    from testbed.cluster import backends
    from testbed.cluster_lease import hold
    from testbed.config import parse_env_pairs
    from testbed.launch import STOP, STOPPED_BY, run_trial, stop_exit_code, stop_on_signals
    from testbed.trial_args import check_timeout, cluster_for, open_store, probe_args, wait_seconds

    check_timeout(args.timeout)
    user_env = parse_env_pairs(args.env, "--env")
    launch_plan.check_user_env(user_env)
    probe_args = probe_args(args)
    wait = wait_seconds(args)
    against = args.against
    names = sorted({against, *(t.compressor for t in trials)})
    if args.no_measure:  # a missing profile is bad input: said before anything else is looked at
        profile_for(trials[0], names, profiles_dir, measure=False, say=say)
    store = open_store(args.out)
    cluster = cluster_for(args, args.world_size)
    trials = launch_plan.resolve_on(cluster, trials)
    prof, source = profile_for(trials[0], names, profiles_dir, measure=not args.no_measure, say=say)
    searches = []
    for t in trials:
        a = aim(t, against, prof, source, profiles_dir, settings.low_bps, settings.high_bps)
        s = dataclasses.replace(settings, start_bps=start_bps(a, settings.low_bps, settings.high_bps))
        searches.append(Search(t, against, s, a))
        said = format_rate(a.bandwidth_bps, 3) if a.kind == "crossover" else f"{a.kind} faster"
        say(f"{searches[-1].label}: the model predicts {said} ({a.source})")
    with hold(args.name, wait_s=wait):
        cluster = backends.open_cluster(args.name)  # read again under the lease: the shaping to restore is current
        stop_on_signals()
        stored = Stored(store)

        def run(t: Trial) -> dict[str, Any]:
            return run_trial(cluster, t, store, timeout_s=args.timeout, probe=not args.no_probe, user_env=user_env,
                             **probe_args)  # fmt: skip

        for search in searches:
            if run_search(search, cluster, store, stored, run, stopped=STOP.is_set, say=say) is None:
                by = STOPPED_BY[0] if STOPPED_BY else "Ctrl-C"
                say(f"interrupted ({by}): every finished trial is stored; run the command again to resume the search")
                return stop_exit_code(), searches
    return 0, searches
