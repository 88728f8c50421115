"""Verify shaping by measurement: iperf3 (JSON mode) between two hosts, compared with the ideal TCP goodput.

Works on any cluster backend: it only needs `cluster.start(host, argv, ...)` for the server and
`cluster.run(host, argv, ...)` for the client and for `ss` (to wait until the server listens).

At high rates one iperf3 process is the bottleneck, not the shaper: before 3.16 iperf3 runs all `-P` streams on one
thread (Ubuntu 22.04 ships 3.9), so one core caps what a probe can see (about 20-40 Gbit/s). Where the installed
iperf3 is older than 3.16 (or its version cannot be read) a multi-stream probe runs one iperf3 process per stream,
each with its own server and port, at the same time, and sums their goodput; from 3.16 on, `-P` threads do it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shaping.plan import LinkShape, ideal_goodput_bps
from testbed.errors import InputError, ProbeError

DEFAULT_PORT = 5201
DEFAULT_TOLERANCE = 0.93  # achieved / ideal goodput below this flags the link
MAX_RATIO = 1.05  # above this (plus one bucket's head start) shaping was not applied
MAX_DURATION_S = 60.0
MAX_STREAMS = 32
PARALLEL_THREADS_SINCE = (3, 16)  # iperf3 3.16 (2023-12) runs each -P stream in its own thread
INTERVAL_S = 0.1  # iperf3 report interval when several processes are summed
MIN_WINDOW_S = 0.3  # shortest common window worth summing over
START_GUARD_S = 0.3  # after the last launch, before every process is surely sending
# one iperf3 thread carries this much on a veth or a NIC (FIELD_NOTES: several processes at >= 25 Gbit/s)
SINGLE_PROCESS_MAX_BPS = 10 * 10**9


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    src: str
    dst: str
    streams: int
    duration_s: float
    requested_bps: int | None  # None: unshaped
    ideal_goodput_bps: float | None
    achieved_bps: float  # receiver-side TCP goodput
    retransmits: int
    processes: int = 1  # iperf3 client processes (one per stream before iperf3 3.16)
    iperf3_version: str | None = None
    burst_bytes: int | None = None  # the link's token bucket (None: unshaped)

    @property
    def ratio(self) -> float | None:
        return self.achieved_bps / self.ideal_goodput_bps if self.ideal_goodput_bps else None

    @property
    def max_ratio(self) -> float | None:
        """The most achieved / ideal a shaped link can show: 1.05, plus one full bucket sent at line rate at the
        start (burst x 8 over the run; docs/shaping.md, the head start). 64 KB at 2 Mbit/s over 1 s: +0.27 (measured
        1.11); at 100 Mbit/s: +0.005."""
        if not self.ideal_goodput_bps:
            return None
        return MAX_RATIO + (self.burst_bytes or 0) * 8 / (self.ideal_goodput_bps * self.duration_s)

    def within(self, tolerance: float) -> bool:
        """True when achieved is at least tolerance x ideal and not meaningfully above what the shaper lets through
        (the rate and one bucket: shaping applied)."""
        if self.ratio is None:
            return True
        return tolerance <= self.ratio <= self.max_ratio

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio, "max_ratio": self.max_ratio}


def check_probe_args(duration_s: float, streams: int, flag_prefix: str = "--") -> None:
    """Duration and streams in range; the flags are named `{flag_prefix}duration` and `{flag_prefix}streams`."""
    if not 1 <= duration_s <= MAX_DURATION_S or duration_s != int(duration_s):
        raise InputError(
            f"{flag_prefix}duration {duration_s:g}: accepted whole seconds 1 to {MAX_DURATION_S:g} (iperf3 reads -t as "
            "an integer: 0.5 would be 0, which means run forever)"
        )
    if not 1 <= streams <= MAX_STREAMS:
        raise InputError(f"{flag_prefix}streams {streams}: accepted 1 to {MAX_STREAMS}")


def _listening(cluster, host, port: int) -> bool:
    out = cluster.run(host, ["ss", "-Hltn", f"sport = :{port}"], timeout_s=10)
    return out.returncode == 0 and bool(out.stdout.strip())


def iperf3_version(cluster, host) -> tuple[int, int] | None:
    """(major, minor) of the iperf3 installed on `host`, or None when `iperf3 --version` does not say."""
    out = cluster.run(host, ["iperf3", "--version"], timeout_s=10)
    m = re.search(r"iperf (\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else None


def processes_for(version: tuple[int, int] | None, streams: int, requested_bps: float | None = None) -> int:
    """iperf3 client processes for `streams` streams: one per stream before 3.16 (or when unknown) where one thread
    may not carry the rate (above SINGLE_PROCESS_MAX_BPS, or unshaped), else one. Several processes start apart, and
    their sum is only as good as the common window (`_concurrent_goodput`): at 300 Mbit/s, 4 streams, a 1 s probe on
    a loaded machine, 4 processes summed to 1.066 of the ideal goodput, one process with -P 4 measured it right."""
    if streams <= 1 or (version is not None and version >= PARALLEL_THREADS_SINCE):
        return 1
    if requested_bps is not None and requested_bps <= SINGLE_PROCESS_MAX_BPS:
        return 1
    return streams


def probe_pair(
    cluster,
    src,
    dst,
    *,
    requested_bps: int | None,
    burst_bytes: int | None = None,
    duration_s: float = 2.0,
    streams: int = 1,
    port: int = DEFAULT_PORT,
    mtu: int = 1500,
    on_start: Callable[[Any], None] | None = None,
) -> ProbeResult:
    """One iperf3 measurement src -> dst with `streams` TCP streams (several processes where iperf3 < 3.16). The
    servers are one-off processes in their own process groups, always ended, with none of this shell's environment
    (the backend gives them PATH); their logs live in a temporary folder removed afterwards. `on_start` is told of
    each server started (a trial notes them, so a command after a SIGKILL of this one can end them). `burst_bytes`:
    the link's bucket (None: the testbed's default for the rate), which bounds how far above the rate it may read."""
    check_probe_args(duration_s, streams)
    version = iperf3_version(cluster, src)
    n_proc = processes_for(version, streams, requested_bps)
    per_proc = streams // n_proc
    log_dir = Path(tempfile.mkdtemp(prefix="testbed-probe-"))
    ports = [port + i for i in range(n_proc)]
    servers = []
    try:
        for p in ports:
            servers.append(cluster.start(dst, ["iperf3", "-s", "-1", "-B", dst.address, "-p", str(p)],
                                         env={}, log_path=log_dir / f"server-{p}.log"))  # fmt: skip
            if on_start is not None:
                on_start(servers[-1])
        deadline = time.monotonic() + 10
        for p, server in zip(ports, servers, strict=True):
            while not _listening(cluster, dst, p):
                if server.poll() is not None:
                    raise ProbeError(f"iperf3 server on {dst.name} exited: {_tail(log_dir / f'server-{p}.log')}")
                if time.monotonic() > deadline:
                    raise ProbeError(f"iperf3 server on {dst.name} did not listen on port {p} within 10 s")
                time.sleep(0.02)  # poll interval while waiting for the listening socket (bounded by the deadline)

        def client(p: int) -> tuple[float, dict]:
            argv = ["iperf3", "-c", dst.address, "-p", str(p), "-t", f"{duration_s:g}", "-P", str(per_proc), "-J",
                    "--connect-timeout", "5000"]  # fmt: skip
            if n_proc > 1:
                # receiver-side intervals, to sum the processes over the window in which they all ran
                argv += ["-i", f"{INTERVAL_S:g}", "--get-server-output"]
            launched = time.monotonic()
            done = cluster.run(src, argv, timeout_s=duration_s + 30)
            try:
                report = json.loads(done.stdout)
            except json.JSONDecodeError:
                raise ProbeError(
                    f"iperf3 {src.name} -> {dst.name} failed: {done.stderr.strip() or done.stdout[-300:]}"
                ) from None
            if "error" in report:
                raise ProbeError(f"iperf3 {src.name} -> {dst.name}: {report['error']}")
            return launched, report

        with concurrent.futures.ThreadPoolExecutor(max_workers=n_proc) as pool:
            reports = list(pool.map(client, ports))
        ends = [r["end"] for _, r in reports]
        achieved = sum(float(e["sum_received"]["bits_per_second"]) for e in ends)
        if n_proc > 1:
            achieved = _concurrent_goodput(reports, duration_s) or achieved
        return ProbeResult(
            src=src.name,
            dst=dst.name,
            streams=streams,
            duration_s=duration_s,
            requested_bps=requested_bps,
            ideal_goodput_bps=ideal_goodput_bps(requested_bps, mtu) if requested_bps else None,
            achieved_bps=achieved,
            retransmits=sum(int(e.get("sum_sent", {}).get("retransmits", 0)) for e in ends),
            processes=n_proc,
            iperf3_version=".".join(map(str, version)) if version else None,
            burst_bytes=LinkShape(requested_bps, burst_bytes).effective_burst_bytes if requested_bps else None,
        )
    finally:
        failed = []
        for server in servers:
            try:
                server.kill_group()
            except Exception as e:  # noqa: BLE001 - one failing kill must not skip the others
                failed.append(f"{dst.name}: {e}")
        shutil.rmtree(log_dir, ignore_errors=True)
        if failed and sys.exc_info()[0] is None:  # never hide the error that ended the probe
            raise ProbeError(f"ending the iperf3 servers failed: {'; '.join(failed)}")


def _concurrent_goodput(reports: list[tuple[float, dict]], duration_s: float) -> float | None:
    """Summed rate of several iperf3 processes over the window in which all of them were sending. Their averages
    alone would overstate it: the processes start a few ms apart, and one that runs alone for a moment takes the whole
    shaped rate. Each process's receiver-side intervals are placed by its launch time; a process's rate is its bytes in the common
    window over the time they cover. None when the common window is too short to say (then the averages are used)."""
    # every process is sending from here on: a process's first interval starts after its connect and handshake,
    # which on a loaded host takes a good part of START_GUARD_S after its launch
    first = max(launched for launched, _ in reports) + START_GUARD_S
    last = min(launched for launched, _ in reports) + duration_s
    if last - first < MIN_WINDOW_S:
        return None
    total = 0.0
    for launched, report in reports:
        bytes_in, seconds = 0.0, 0.0
        for interval in (report.get("server_output_json") or {}).get("intervals", []):
            s = interval["sum"]
            mid = launched + (s["start"] + s["end"]) / 2
            if first <= mid <= last and not s.get("omitted"):
                bytes_in += s["bytes"]
                seconds += s["end"] - s["start"]
        if seconds <= 0:
            return None
        total += bytes_in * 8 / seconds
    return total


def all_pairs(hosts: list) -> list[tuple]:
    """Every ordered pair (src, dst), src != dst: each direction of each link, measured one at a time."""
    if len(hosts) < 2:
        raise InputError("probing needs at least 2 hosts")
    return [(a, b) for a in hosts for b in hosts if a is not b]


def ring_pairs(hosts: list) -> list[tuple]:
    """h0->h1, h1->h2, ..., h(n-1)->h0: every host sends once and receives once."""
    if len(hosts) < 2:
        raise InputError("probing needs at least 2 hosts")
    if len(hosts) == 2:
        return [(hosts[0], hosts[1]), (hosts[1], hosts[0])]
    return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]


def _tail(path: Path, n: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except FileNotFoundError:
        return "(no output)"
