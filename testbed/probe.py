"""Verify shaping by measurement: iperf3 (JSON mode) between two hosts, compared with the ideal TCP goodput.

Works on any cluster backend: it only needs `cluster.start(host, argv, ...)` for the server and
`cluster.run(host, argv, ...)` for the client and for `ss` (to wait until the server listens).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from shaping.plan import ideal_goodput_bps
from testbed.errors import InputError, ProbeError

DEFAULT_PORT = 5201
DEFAULT_TOLERANCE = 0.93  # achieved / ideal goodput below this flags the link
MAX_DURATION_S = 60.0
MAX_STREAMS = 32


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

    @property
    def ratio(self) -> float | None:
        return self.achieved_bps / self.ideal_goodput_bps if self.ideal_goodput_bps else None

    def within(self, tolerance: float) -> bool:
        """True when achieved is at least tolerance x ideal and not meaningfully above the rate (shaping applied)."""
        if self.ratio is None:
            return True
        return tolerance <= self.ratio <= 1.05

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ratio": self.ratio}


def check_probe_args(duration_s: float, streams: int) -> None:
    if not 0.5 <= duration_s <= MAX_DURATION_S:
        raise InputError(f"--duration {duration_s}: accepted 0.5 to {MAX_DURATION_S:g} seconds")
    if not 1 <= streams <= MAX_STREAMS:
        raise InputError(f"--streams {streams}: accepted 1 to {MAX_STREAMS}")


def _listening(cluster, host, port: int) -> bool:
    out = cluster.run(host, ["ss", "-Hltn", f"sport = :{port}"], timeout_s=10)
    return out.returncode == 0 and bool(out.stdout.strip())


def probe_pair(
    cluster,
    src,
    dst,
    *,
    requested_bps: int | None,
    duration_s: float = 2.0,
    streams: int = 1,
    port: int = DEFAULT_PORT,
    mtu: int = 1500,
) -> ProbeResult:
    """One iperf3 run src -> dst. The server is a one-off process in its own process group, always ended."""
    check_probe_args(duration_s, streams)
    log_dir = Path(tempfile.mkdtemp(prefix="testbed-probe-"))
    server = cluster.start(
        dst,
        ["iperf3", "-s", "-1", "-B", dst.address, "-p", str(port)],
        env=dict(os.environ),
        log_path=log_dir / "server.log",
    )
    try:
        deadline = time.monotonic() + 10
        while not _listening(cluster, dst, port):
            if server.poll() is not None:
                raise ProbeError(f"iperf3 server on {dst.name} exited: {_tail(log_dir / 'server.log')}")
            if time.monotonic() > deadline:
                raise ProbeError(f"iperf3 server on {dst.name} did not listen on port {port} within 10 s")
            time.sleep(0.02)  # poll interval while waiting for the listening socket (bounded by the deadline)
        client = cluster.run(
            src,
            [
                "iperf3",
                "-c",
                dst.address,
                "-p",
                str(port),
                "-t",
                f"{duration_s:g}",
                "-P",
                str(streams),
                "-J",
                "--connect-timeout",
                "5000",
            ],
            timeout_s=duration_s + 30,
        )
        try:
            report = json.loads(client.stdout)
        except json.JSONDecodeError:
            raise ProbeError(
                f"iperf3 {src.name} -> {dst.name} failed: {client.stderr.strip() or client.stdout[-300:]}"
            ) from None
        if "error" in report:
            raise ProbeError(f"iperf3 {src.name} -> {dst.name}: {report['error']}")
        end = report["end"]
        return ProbeResult(
            src=src.name,
            dst=dst.name,
            streams=streams,
            duration_s=duration_s,
            requested_bps=requested_bps,
            ideal_goodput_bps=ideal_goodput_bps(requested_bps, mtu) if requested_bps else None,
            achieved_bps=float(end["sum_received"]["bits_per_second"]),
            retransmits=int(end.get("sum_sent", {}).get("retransmits", 0)),
        )
    finally:
        server.kill_group()


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
