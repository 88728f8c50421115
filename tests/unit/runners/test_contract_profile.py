"""The runner's profiler and the performance model agree on the profile format (a real measurement, no stand-in)."""

from runners.profile import profile_model
from testbed import perfmodel as pm


def test_measured_profile_feeds_the_model():
    data = profile_model("mlp", 4, ["syncsgd", "powersgd", "topk"], image_size=None, seq_len=None, iters=1)
    profile = pm.profile_from_dict(data, source="test")
    assert profile.forward_s > 0 and profile.backward_s > 0
    assert sum(b.grad_bytes for b in profile.buckets) > 0
    slow = pm.predict_iteration(profile, "syncsgd", pm.Network(world_size=2, bandwidth_bps=1e6))
    fast = pm.predict_iteration(profile, "syncsgd", pm.Network(world_size=2, bandwidth_bps=1e9))
    assert slow.iter_time_s > fast.iter_time_s  # communication time shrinks with bandwidth
    assert set(profile.compressor_names()) >= {"syncsgd", "powersgd", "topk"}
