"""``--trace N``: N extra iterations between warm-up and the measured ones, recorded with ``torch.profiler``.

CPU activities always, CUDA activities on a CUDA device; the testbed's phases are ``record_function`` ranges
(``testbed.forward``, ``testbed.backward``, ``testbed.reduce`` in serial mode, ``testbed.optimizer``, and one
``testbed.iteration`` around each), so a viewer shows which kernels and collectives each phase contains. The trace is
written as Chrome-trace JSON, ``trace_rank<r>.json``, which Perfetto (ui.perfetto.dev), chrome://tracing and
TensorBoard's profiler plugin open. Traced iterations are not measured: the profiler's own cost never reaches the row.
"""

from __future__ import annotations

import os


class Tracer:
    """Profiles the steps it is told to; ``phase(name)`` closes the open range and opens ``testbed.<name>``
    (``None`` closes only). Every call is a no-op while not profiling."""

    def __init__(self, device, out_dir: str, rank: int) -> None:
        self.device = device
        self.path = os.path.join(out_dir, f"trace_rank{rank}.json")
        self.prof = None
        self.ranges: list = []

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if getattr(self.device, "type", "cpu") == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities, record_shapes=False)
        self.prof.start()

    def phase(self, name: str | None) -> None:
        """Close the open phase and open ``testbed.<name>`` (inside a ``testbed.iteration`` opened by the first phase
        of an iteration); ``None`` ends the iteration."""
        if self.prof is None:
            return
        from torch.profiler import record_function

        if name is None:
            self._close_all()
            return
        if not self.ranges:
            self._enter(record_function("testbed.iteration"))
        while len(self.ranges) > 1:
            self.ranges.pop().__exit__(None, None, None)
        self._enter(record_function(f"testbed.{name}"))

    def _enter(self, rf) -> None:
        rf.__enter__()
        self.ranges.append(rf)

    def _close_all(self) -> None:
        while self.ranges:
            self.ranges.pop().__exit__(None, None, None)

    def finish(self) -> str | None:
        """Stop profiling and write the Chrome trace; returns its path (None when nothing was profiled)."""
        if self.prof is None:
            return None
        self._close_all()
        self.prof.stop()
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = self.path + ".tmp"
        self.prof.export_chrome_trace(tmp)
        os.replace(tmp, self.path)
        self.prof = None
        return self.path
