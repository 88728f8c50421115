"""The performance model: predicted iteration time per compressor, crossover bandwidth, what-if knobs.

Pure functions over frozen dataclasses, torch-free; SI units with the unit in the name (`_s`, `_bytes`, `_bps`).
One module per job (docs/performance-model.md has the derivation and where it breaks):

    profiles      a workload's measured costs: `Profile`, the `testbed.profile/1` JSON, pick and pool profiles
    collectives   the alpha-beta collective costs and the `Network` whose terms they use
    prediction    one iteration composed from a profile on a network (`predict_iteration`, `predict_curves`)
    crossovers    the crossover bandwidth, the rule among several crossings, the best speedup (`summarize`)
    whatif        the same profile on faster compute or codecs, or without overlap
    synthetic     a profile from a handful of numbers (docs, demos, tests)
    fit           the calibration's fit of latency, bandwidth, host and contention costs from the microbenchmark
    calibration   a calibration (`Calibration`), its `testbed.calibration/1` JSON, which one a prediction uses
    terms         the collective terms a prediction uses: one calibration's or several rates' interpolated

Every public name is importable from here (`from testbed.perfmodel import predict_iteration`); new code may import
from the module that owns it.
"""

from testbed.perfmodel.calibration import (
    CALIBRATION_SCHEMA,
    COLLBENCH_SCHEMA,
    Calibration,
    calibration_filename,
    calibration_from_bench,
    calibration_from_dict,
    calibration_to_dict,
    find_calibrations,
    load_calibration,
    pick_calibration,
    save_calibration,
)
from testbed.perfmodel.collectives import (
    COLLECTIVES,
    Bottleneck,
    Layout,
    Network,
    allgather_time_s,
    allreduce_time_s,
    collective_contention_s,
    collective_host_s,
    collective_time_s,
    from_flat_trials_s,
    ring_bottleneck,
)
from testbed.perfmodel.crossovers import (
    Crossover,
    SpeedupSummary,
    choose_crossing,
    crossover,
    crossover_from_samples,
    crossover_interval,
    find_crossover,
    log_grid,
    rate_text,
    summarize,
)
from testbed.perfmodel.fit import (
    CollSample,
    ContentionSample,
    Fitted,
    LineFit,
    bus_factor,
    contention_terms,
    fit_collectives,
    fit_efficiency,
    fit_line,
    host_per_byte,
)
from testbed.perfmodel.prediction import (
    ASYNC_COMPRESSORS,
    BOUND_TERMS,
    BucketTimeline,
    Prediction,
    Terms,
    at,
    compute_done_between,
    compute_finish_s,
    predict_curves,
    predict_iteration,
    slowest_rank_s,
    straggler_s,
)
from testbed.perfmodel.profiles import (
    BASELINES,
    COMPRESSORS,
    PROFILE_SCHEMA,
    CodecBucket,
    CompressorProfile,
    GradBucket,
    Profile,
    find_profiles,
    load_profile,
    pick_profile,
    pool_profiles,
    profile_filename,
    profile_from_dict,
    profile_to_dict,
)
from testbed.perfmodel.synthetic import SYNTHETIC_CODECS, synthetic_profile_dict
from testbed.perfmodel.terms import (
    DEFAULT_EFFICIENCY,
    DEFAULT_LATENCY_S,
    ModelTerms,
    TermsByRate,
    calibrated_rate_bps,
    comm_rel_spread,
    is_extrapolated,
    model_terms,
    pick_calibrations,
    terms_for,
)
from testbed.perfmodel.whatif import (
    serialized,
    what_if,
    with_codec_speedup,
    with_compute_speedup,
    without_lockstep_floors,
)

__all__ = [
    "ASYNC_COMPRESSORS", "BASELINES", "CALIBRATION_SCHEMA", "COLLBENCH_SCHEMA", "COLLECTIVES", "COMPRESSORS",
    "DEFAULT_EFFICIENCY", "DEFAULT_LATENCY_S", "PROFILE_SCHEMA", "SYNTHETIC_CODECS",
    "Bottleneck", "BucketTimeline", "Calibration", "CodecBucket", "CollSample", "CompressorProfile", "ContentionSample",
    "Crossover", "Fitted", "GradBucket", "Layout", "LineFit", "ModelTerms", "Network", "Prediction", "Profile",
    "SpeedupSummary", "Terms", "TermsByRate",
    "allgather_time_s", "allreduce_time_s", "at", "bus_factor", "calibrated_rate_bps", "calibration_filename",
    "calibration_from_bench", "calibration_from_dict", "calibration_to_dict", "choose_crossing",
    "collective_contention_s", "collective_host_s", "collective_time_s", "compute_done_between", "compute_finish_s",
    "contention_terms", "crossover", "crossover_from_samples", "find_calibrations", "find_crossover",
    "find_profiles", "fit_collectives", "from_flat_trials_s", "fit_efficiency", "fit_line", "host_per_byte", "load_calibration",
    "load_profile", "log_grid", "model_terms", "pick_calibration", "pick_calibrations", "pick_profile",
    "pool_profiles", "predict_curves", "predict_iteration", "profile_filename", "profile_from_dict",
    "profile_to_dict", "rate_text", "ring_bottleneck", "save_calibration", "serialized", "slowest_rank_s", "straggler_s", "summarize",
    "synthetic_profile_dict", "terms_for", "comm_rel_spread", "is_extrapolated", "BOUND_TERMS", "crossover_interval", "what_if", "with_codec_speedup", "with_compute_speedup",
    "without_lockstep_floors",
]  # fmt: skip
