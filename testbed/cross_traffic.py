"""Traffic that shares the wire (issue 36): `--cross-traffic N` runs N bulk TCP flows for the length of a trial.

Each flow is one iperf3 client with `--bidir` (both directions at once) against a one-off iperf3 server, between a
pair of the trial's hosts: flow k joins host k mod n with the host half the ring away, so with two racks every flow
crosses the spine. Every process runs in a process group of its own (`Cluster.start`), under `timeout -s KILL` at the
trial's time limit, so a flow is bounded in time even if nothing ends it; the launcher starts the flows right after
shaping (the probe then measures what the trial really gets) and ends them with the ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.errors import LaunchError

BASE_PORT = 5301  # the probe uses 5201 and up; ranks use 20000-29999 and ephemeral ports
LISTEN_TIMEOUT_S = 10.0
SETTLE_S = 0.5  # after the clients start: each must still run (connected) before the trial goes on
KILL_MARGIN_S = 30.0


def pairs(n_hosts: int, flows: int) -> list[tuple[int, int]]:
    """Host index pairs (client, server) of `flows` flows on `n_hosts` hosts: k mod n with the host half the ring away
    (with two racks of consecutive hosts: across the spine)."""
    if n_hosts < 2:
        return []
    out = []
    for k in range(flows):
        a = k % n_hosts
        out.append((a, (a + max(1, n_hosts // 2)) % n_hosts))
    return out


def describe(hosts: list, flows: int) -> str:
    return ",".join(f"{hosts[a].name}<->{hosts[b].name}" for a, b in pairs(len(hosts), flows))


def _listening(cluster, host, port: int) -> bool:
    out = cluster.run(host, ["ss", "-Hltn", f"sport = :{port}"], timeout_s=10)
    return out.returncode == 0 and bool(out.stdout.strip())


def start(
    cluster,
    hosts: list,
    flows: int,
    *,
    duration_s: float,
    log_dir: Path,
    on_start: Callable[[Any], None] = lambda _p: None,
) -> list:
    """Start `flows` bidirectional iperf3 flows between the trial's hosts; returns their processes (servers and
    clients), which `stop` ends. Raises LaunchError (after ending what it started) when a flow does not run."""
    procs: list = []
    if flows <= 0 or len(hosts) < 2:
        return procs
    limit = int(math.ceil(duration_s + KILL_MARGIN_S))
    try:
        plan = [(hosts[a], hosts[b], BASE_PORT + k) for k, (a, b) in enumerate(pairs(len(hosts), flows))]
        for _, server, port in plan:
            argv = ["timeout", "-s", "KILL", str(limit), "iperf3", "-s", "-1", "-p", str(port)]
            procs.append(cluster.start(server, argv, env={}, log_path=log_dir / f"cross{port}_server.log"))
            on_start(procs[-1])
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        for _, server, port in plan:
            while not _listening(cluster, server, port):
                if time.monotonic() > deadline:
                    raise LaunchError(f"cross traffic: iperf3 server on {server.name}:{port} did not listen")
                time.sleep(0.05)  # polling for the listener, bounded by the deadline
        clients = []
        for client, server, port in plan:
            argv = ["timeout", "-s", "KILL", str(limit), "iperf3", "-c", server.address, "-p", str(port), "--bidir",
                    "-t", str(int(math.ceil(duration_s))), "-i", "0"]  # fmt: skip
            procs.append(cluster.start(client, argv, env={}, log_path=log_dir / f"cross{port}_client.log"))
            on_start(procs[-1])
            clients.append(procs[-1])
        time.sleep(SETTLE_S)  # a client that could not connect exits at once
        dead = [c for c in clients if c.poll() is not None]
        if dead:
            raise LaunchError(
                f"cross traffic: {len(dead)} of {len(clients)} iperf3 clients exited at once (exit {dead[0].poll()}); "
                f"see {dead[0].log_path}"
            )
    except BaseException:
        stop(procs)
        raise
    return procs


RTT_PINGS = 12  # pings to the ring neighbour while the flows run (2.4 s at 0.2 s apart)
RTT_INTERVAL_S = 0.2  # below 0.2 s ping needs root; lab hosts run it as the SSH user
RTT_SKIP = 3  # the first replies, while the flows still build their standing queue


def loaded_rtt_s(cluster, src, dst) -> float | None:
    """The round-trip time from `src` to its ring neighbour `dst` while the cross traffic runs: the median of the
    replies after the first RTT_SKIP (seconds), None when ping is missing or nothing came back. A ring step's chunk
    waits behind the bulk flows' standing queue (docs/topologies.md: 0.1 ms unloaded, 13-82 ms with one to four
    flows at 20 Mbit/s). Recorded in the row as an observation: the model takes what the flows leave a collective,
    its waits behind the queue included, from a calibration beside the same flows (`testbed calibrate
    --cross-traffic N`), not from this figure."""
    argv = ["ping", "-n", "-c", str(RTT_PINGS), "-i", str(RTT_INTERVAL_S), "-W", "2", dst.address]
    try:
        out = cluster.run(src, argv, timeout_s=RTT_PINGS * RTT_INTERVAL_S + 10)
    except Exception:  # noqa: BLE001 - a missing ping or a broken host: no figure, the trial goes on
        return None
    return rtt_from_ping(out.stdout)


def rtt_from_ping(text: str) -> float | None:
    """Median reply time (seconds) of ping's output, the first RTT_SKIP replies left out (all of them when fewer)."""
    import re
    import statistics

    times = [float(m) / 1e3 for m in re.findall(r"time[=<]([0-9.]+) ?ms", text)]
    if not times:
        return None
    return statistics.median(times[RTT_SKIP:] if len(times) > RTT_SKIP else times)


def stop(procs: list) -> list[str]:
    """End every cross-traffic process (its whole process group); returns what failed, in words."""
    problems = []
    for p in procs:
        try:
            p.kill_group(grace_s=1.0)
        except Exception as e:  # noqa: BLE001 - the others must still be ended
            problems.append(f"ending cross traffic process {getattr(p, 'pid', '?')} failed ({e})")
    return problems
