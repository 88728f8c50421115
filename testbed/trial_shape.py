"""A trial's cluster shape (issue 36): per-host rates (a straggler link), netem delay/jitter/loss, and the numbers the
row records about racks and cross traffic; how the shape is applied through the Cluster interface, and the Layout
the performance model reads it as.

- `--host-bw h2=1gbit` (repeatable, or comma-separated): host h2's link at 1 Gbit/s, the others at `--bw`. Part of
  the trial id only when set, so the ids of trials without it do not change.
- `--straggler-bw 1gbit,500mbit` (sweep): one trial per rate with `--straggler-host` (default h1) at that rate.
- `--delay/--jitter/--loss`: netem under the rate limiter; refused with one line where the kernel lacks sch_netem.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from shaping.plan import LinkShape
from shaping.units import UNSHAPED, format_rate, is_unshaped, parse_rate_bps, rate_or_unshaped
from testbed.cluster.base import oversubscription
from testbed.errors import InputError

MAX_CROSS_FLOWS = 16  # per trial; each is one iperf3 --bidir flow (two TCP directions)
MAX_LOSS_PCT = 100.0
# a trial's shape fields at their defaults are left out of its id: trials from before issue 36 keep their ids
SHAPE_DEFAULTS: dict[str, Any] = {"host_rates": (), "cross_traffic": 0, "jitter_s": 0.0, "loss_pct": 0.0, "racks": 1,
                                  "uplink_bps": None}  # fmt: skip
DEFAULT_STRAGGLER_HOST = "h1"
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


# ------------------------------------------------------------------------------------------------ parsing and checks
def parse_rate_or_none(text: str, what: str) -> int | None:
    """A rate in bits/s, or None for `none`. `0` is refused: an unset variable must not mean unshaped. The one rule for
    --bw, --host-bw and --straggler-bw (testbed.config.parse_rates)."""
    if is_unshaped(text):
        return None
    if str(text).strip().lower() in ("0", "0bit"):
        raise InputError(f"{what} {text}: 0 is not a rate; an unshaped link is spelled {UNSHAPED}")
    return parse_rate_bps(text, what)


def parse_host_bw(items: list[str] | None, flag: str = "--host-bw") -> tuple[tuple[str, int | None], ...]:
    """`h2=1gbit` words (repeatable flag, or comma-separated) as sorted (host, rate_bps | None) pairs."""
    out: dict[str, int | None] = {}
    for item in items or []:
        for word in str(item).split(","):
            host, sep, rate = word.strip().partition("=")
            if not sep or not host or not rate:
                raise InputError(f"{flag} {word.strip()!r}: expected HOST=RATE, e.g. h2=1gbit")
            if not _HOST_NAME.match(host):
                raise InputError(f"{flag} {host!r}: not a host name (letters, digits, _ . -)")
            if host in out:
                raise InputError(f"{flag} {host} given twice")
            out[host] = parse_rate_or_none(rate, f"{flag} {host}")
    return tuple(sorted(out.items()))


def check_trial_shape(t: Any) -> None:
    """The shape fields of a Trial: InputError naming the flag and what is accepted."""
    if not isinstance(t.host_rates, tuple):
        raise InputError(f"--host-bw {t.host_rates!r}: expected (host, rate) pairs")
    for pair in t.host_rates:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and _HOST_NAME.match(pair[0])):
            raise InputError(f"--host-bw {pair!r}: expected HOST=RATE, e.g. h2=1gbit")
        rate = pair[1]
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0):
            raise InputError(f"--host-bw {pair[0]}={rate!r}: expected a rate > 0 (or none)")
    if len({h for h, _ in t.host_rates}) != len(t.host_rates):
        raise InputError("--host-bw: a host is named twice")
    check_cross_traffic(t.cross_traffic)
    for name, value, high in (("--jitter", t.jitter_s, 60.0), ("--loss", t.loss_pct, MAX_LOSS_PCT)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
            raise InputError(f"{name} {value!r}: expected a number from 0 to {high:g}")
    if isinstance(t.racks, bool) or not isinstance(t.racks, int) or t.racks < 1:
        raise InputError(f"racks {t.racks!r}: expected an integer >= 1 (the cluster's, from `testbed up --racks`)")
    up = t.uplink_bps
    if up is not None and (isinstance(up, bool) or not isinstance(up, int) or up <= 0 or t.racks < 2):
        raise InputError(f"uplink {up!r}: expected a rate > 0 on a cluster of 2 or more racks (`testbed up --uplink`)")
    if t.rate_bps is None and (t.jitter_s or t.loss_pct):
        raise InputError("--jitter and --loss need a rate: an unshaped trial (--bw none) has no netem under a shaper")


def check_cross_traffic(k: Any) -> None:
    """--cross-traffic N (a trial's, a calibration's): an integer from 0 to MAX_CROSS_FLOWS, else InputError."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_CROSS_FLOWS:
        raise InputError(f"--cross-traffic {k!r}: expected an integer from 0 to {MAX_CROSS_FLOWS} (bulk TCP flows)")


def check_hosts(trial: Any, hosts: list) -> None:
    """Every host --host-bw names is one of the cluster's (exit 2 before anything changes)."""
    names = [h.name for h in hosts]
    for host, _ in trial.host_rates:
        if host not in names:
            raise InputError(f"--host-bw {host}: no such host; this cluster has {', '.join(names)}")


def with_stragglers(trials: list, host: str, rates: list[int | None]) -> list:
    """--straggler-bw: every trial of the grid once per rate, with `host`'s link at that rate (none: no straggler)."""
    if not _HOST_NAME.match(host or ""):
        raise InputError(f"--straggler-host {host!r}: not a host name")
    out = []
    for t in trials:
        for rate in rates:
            pairs = {**dict(t.host_rates), host: rate} if rate is not None else dict(t.host_rates)
            out.append(dataclasses.replace(t, host_rates=tuple(sorted(pairs.items()))))
    return list(dict.fromkeys(out))


def label(trial: Any) -> str:
    """What the shape adds to a trial's label: ` h2@1Gbit/s`, ` +2 cross flows`, ` delay 5ms`, ` 2 racks (uplink
    10mbit)`."""
    text = "".join(f" {h}@{rate_or_unshaped(r)}" for h, r in trial.host_rates)
    if trial.racks > 1:
        text += f" {trial.racks} racks (uplink {rate_or_unshaped(trial.uplink_bps)})"
    if trial.cross_traffic:
        text += f" +{trial.cross_traffic} cross flow{'s' * (trial.cross_traffic != 1)}"
    if trial.delay_s:
        text += f" delay {trial.delay_s * 1e3:g}ms"
    return text


# ------------------------------------------------------------------------------------------------ shaping
def host_shape(trial: Any, host: str) -> LinkShape | None:
    """The shape of `host`'s link in this trial: its --host-bw rate, else the trial's rate (None: unshaped)."""
    rates = dict(trial.host_rates)
    rate = rates[host] if host in rates else trial.rate_bps
    if rate is None:
        return None
    base = trial.shape
    if base is None:
        return LinkShape(rate, None, trial.qdisc)
    burst = base.burst_bytes if rate == base.rate_bps else None  # a given burst was sized for --bw's rate
    return dataclasses.replace(base, rate_bps=rate, burst_bytes=burst)


def apply(cluster: Any, trial: Any, hosts: list) -> None:
    """Shape every host's link as the trial says, through the Cluster interface: the trial's rate on all, then each
    --host-bw host at its own. The caller restores the cluster's configured shaping afterwards."""
    if trial.shape is not None:
        cluster.apply_shaping(trial.shape, hosts)
    else:
        cluster.clear_shaping(hosts)
    for host in hosts:
        if host.name in dict(trial.host_rates):
            shape = host_shape(trial, host.name)
            if shape is not None:
                cluster.apply_shaping(shape, [host])
            else:
                cluster.clear_shaping([host])


NETEM_MISSING = "--delay/--jitter/--loss need the netem qdisc (sch_netem), which this kernel lacks (modprobe sch_netem)"


def check_netem(trial: Any, netem_available: Callable[[], bool]) -> None:
    """A trial with delay, jitter or loss where `netem_available()` says no (the local cluster's kernel:
    testbed.cluster.topology.netem_available): one line, exit 2, nothing changed."""
    if (trial.delay_s or trial.jitter_s or trial.loss_pct) and not netem_available():
        raise InputError(NETEM_MISSING)


# ------------------------------------------------------------------------------------------------ the row, the model
def cluster_racks(cluster: Any) -> dict[str, Any]:
    """The cluster's racks as its record keeps them (`up --racks --uplink`): count, members, uplink_bps; {} on one
    switch."""
    return (getattr(cluster, "record", None) or {}).get("racks") or {}


def on_racks(cluster: Any) -> tuple[int, int | None]:
    """(racks, uplink_bps) of the cluster, as a trial on it records them (Trial.racks, Trial.uplink_bps)."""
    topo = cluster_racks(cluster)
    return int(topo.get("count", 1)), topo.get("uplink_bps")


def row_fields(cluster: Any, trial: Any) -> dict[str, Any]:
    """The shape columns of a trial's row: per-host rates (JSON), the slowest host link, cross-traffic flows,
    netem jitter/loss, and the racks and spine the trial ran behind (resolved from the cluster: Trial.racks,
    Trial.uplink_bps) with the worst rack's oversubscription (its members from the cluster's record)."""
    per_host = {h.name: dict(trial.host_rates).get(h.name, trial.rate_bps) for h in cluster.hosts()}
    shaped = [r for r in per_host.values() if r is not None]
    over = oversubscription(cluster_racks(cluster).get("members") or [], per_host, trial.uplink_bps)
    return {
        "host_rates": json.dumps(dict(trial.host_rates), sort_keys=True) if trial.host_rates else None,
        "min_host_rate_bps": min(shaped) if shaped else 0,
        "cross_traffic": trial.cross_traffic,
        "jitter_s": trial.jitter_s,
        "loss_pct": trial.loss_pct,
        "racks": trial.racks,
        "uplink_bps": trial.uplink_bps,
        "oversubscription": over,
    }


def layout(host_names: list[str], trial_rate_bps: int | None, host_rates: dict[str, int | None], *,
           rack_of: list[int] | None = None, uplink_bps: int | None = None,
           cross_pairs: list[tuple[int, int]] = ()):  # fmt: skip
    """The perfmodel Layout of a trial on hosts in ring order: rates, racks, and the cross-traffic flows (host index
    pairs, each both directions) counted on each host link and each uplink they cross."""
    from testbed.perfmodel import Layout

    n = len(host_names)
    flows = [0] * n
    racks = list(rack_of or [0] * n)
    spine = [0] * (max(racks) + 1)
    for a, b in cross_pairs:
        flows[a] += 1
        flows[b] += 1
        if racks[a] != racks[b]:
            spine[racks[a]] += 1
            spine[racks[b]] += 1
    return Layout(
        tuple(host_rates.get(h, trial_rate_bps) for h in host_names),
        rack_of=tuple(racks),
        uplink_bps=uplink_bps,
        cross_flows=tuple(flows),
        spine_cross_flows=tuple(spine),
    )


def _count(value: Any, default: int = 0) -> int:
    """A row's integer cell: null (None or NaN in a frame) is `default`."""
    return default if value is None or value != value else int(value)


def row_layout(row: Any):
    """The Layout of a local-cluster trial as its row records it: hosts h0..h(n-1) in ring order (ranks follow host
    order), each at its --host-bw rate or the trial's, racks of consecutive hosts (cluster.base.rack_members)
    behind the row's uplink, and the cross-traffic flows where cross_traffic.pairs places them."""
    from testbed import cross_traffic
    from testbed.cluster.base import rack_members

    n = _count(row["host_count"], 1)
    hosts = [f"h{i}" for i in range(n)]
    text = row.get("host_rates")
    host_rates = json.loads(text) if isinstance(text, str) else {}
    racks = _count(row.get("racks"), 1)
    rack_of = {h: j for j, members in enumerate(rack_members(n, racks)) for h in members} if racks > 1 else {}
    return layout(hosts, _count(row["rate_bps"]) or None, host_rates,
                  rack_of=[rack_of.get(h, 0) for h in hosts], uplink_bps=_count(row.get("uplink_bps")) or None,
                  cross_pairs=cross_traffic.pairs(n, _count(row.get("cross_traffic"))))  # fmt: skip


def describe_rates(host_rates: tuple[tuple[str, int | None], ...]) -> str:
    return ", ".join(f"{h}={format_rate(r) if r else 'none'}" for h, r in host_rates) or "none"


# ------------------------------------------------------------------------------------------------ flags
def add_flags(p: Any, sweep: bool = False) -> None:
    """The shape flags of `run` and `sweep` (registered beside what they fill: `from_args`)."""
    g = p.add_argument_group("cluster shape: stragglers, cross traffic, latency (docs/topologies.md)")
    g.add_argument(
        "--host-bw",
        action="append",
        metavar="HOST=RATE",
        help="one host's link at its own rate, e.g. h2=1gbit (a straggler; repeatable)",
    )
    g.add_argument(
        "--cross-traffic",
        type=int,
        metavar="N",
        help="N bulk TCP flows (iperf3, both directions) between the trial's hosts for its length",
    )
    g.add_argument("--delay", help="one-way delay on every link (netem, needs sch_netem), e.g. 5ms")
    g.add_argument("--jitter", help="delay variation (needs --delay), e.g. 1ms")
    g.add_argument("--loss", help="packet loss on every link (netem), e.g. 0.1%%")
    if sweep:
        g.add_argument(
            "--straggler-bw",
            metavar="RATES",
            help="a sweep dimension: --straggler-host's link at each of these rates, e.g. 1gbit,100mbit "
            "(none: no straggler)",
        )
        g.add_argument("--straggler-host", help=f"the straggler of --straggler-bw (default {DEFAULT_STRAGGLER_HOST})")


SHAPE_FLAGS = ("host_bw", "cross_traffic", "delay", "jitter", "loss")


def given_flags(args: Any) -> list[str]:
    """The shape flags given (for the refusal beside --config)."""
    return [f"--{k.replace('_', '-')}" for k in SHAPE_FLAGS if getattr(args, k, None) is not None]


def from_args(args: Any) -> dict[str, Any]:
    """The Trial fields the shape flags give (their defaults when not given)."""
    from shaping.units import parse_time_s

    loss = getattr(args, "loss", None)
    loss_pct = 0.0
    if loss is not None:
        try:
            loss_pct = float(str(loss).strip().rstrip("%"))
        except ValueError:
            raise InputError(f"--loss {loss!r}: expected a percentage, e.g. 0.1%") from None
    return {
        "host_rates": parse_host_bw(getattr(args, "host_bw", None)),
        "cross_traffic": 0 if getattr(args, "cross_traffic", None) is None else args.cross_traffic,
        "delay_s": parse_time_s(args.delay, "--delay") if getattr(args, "delay", None) else 0.0,
        "jitter_s": parse_time_s(args.jitter, "--jitter") if getattr(args, "jitter", None) else 0.0,
        "loss_pct": loss_pct,
    }


def stragglers_from_args(args: Any, trials: list) -> list:
    """--straggler-bw: the grid once per straggler rate (unchanged without the flag)."""
    text = getattr(args, "straggler_bw", None)
    host = getattr(args, "straggler_host", None)
    if text is None:
        if host is not None:
            raise InputError("--straggler-host needs --straggler-bw RATES")
        return trials
    words = [w.strip() for w in str(text).split(",")]
    if not all(words):
        raise InputError(f"--straggler-bw {text!r}: an item is empty; expected comma-separated rates (or none)")
    rates = [parse_rate_or_none(w, "--straggler-bw") for w in words]
    return with_stragglers(trials, host or DEFAULT_STRAGGLER_HOST, rates)


def check_on_cluster(trials: list, cluster: Any, netem_available: Callable[[], bool] | None) -> None:
    """Before anything changes: every --host-bw host is the cluster's, and netem exists where a trial needs it
    (`netem_available`: the local cluster's probe; None: the hosts' own shaping tool says so when it applies)."""
    hosts = cluster.hosts()
    for t in trials:
        check_hosts(t, hosts)
        if netem_available is not None:
            check_netem(t, netem_available)
        if t.cross_traffic and len(hosts) < 2:
            raise InputError(f"--cross-traffic {t.cross_traffic}: needs at least two hosts; this cluster has one")
