"""The tables and lines that `testbed profile`, `calibrate` and `predict` print (rich): views of the performance
model's data, no logic of their own. model_cli.py parses, calls one function and prints these."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from shaping.units import format_rate, format_size, rate_or_unshaped
from testbed import perfmodel as pm


def profile_table(profile: pm.Profile) -> Table:
    t = Table(
        title=f"{profile.model} bs{profile.batch_size} on {profile.device}: forward "
        f"{profile.forward_s * 1e3:.1f} ms, backward {profile.backward_s * 1e3:.1f} ms, optimizer "
        f"{profile.optimizer_s * 1e3:.1f} ms (iteration-to-iteration spread {profile.compute_jitter_s * 1e3:.1f} ms), "
        f"{len(profile.buckets)} bucket(s), "
        f"{profile.grad_bytes / 1e6:.1f} MB of gradients"
        + (f", {profile.colocated_ranks} ranks computing at once" if profile.colocated_ranks > 1 else "")
        + (f" on the hosts of cluster {profile.colocated_on}" if profile.colocated_on else "")
    )
    for col in ("compressor", "collective", "rounds", "payload MB", "ratio", "encode ms", "decode ms"):
        t.add_column(col, justify="left" if col in ("compressor", "collective") else "right")
    for name in profile.compressor_names():
        c = profile.compressor(name)
        t.add_row(
            name,
            c.collective,
            str(c.rounds),
            f"{c.payload_bytes / 1e6:.3f}",
            f"{profile.grad_bytes / c.payload_bytes:.1f}x" if c.payload_bytes else "-",
            f"{c.encode_s * 1e3:.2f}",
            f"{c.decode_s * 1e3:.2f}",
        )
    return t



def calibration_table(c: pm.Calibration) -> Table:
    f = c.fitted
    t = Table(
        title=f"cluster {c.cluster}: {c.backend}, {c.world_size} ranks, "
        f"{rate_or_unshaped(c.rate_bps)} (nccl-tests convention: size = all-gather output)"
    )
    for col in ("collective", "size", "time ms", "host CPU ms", "algbw", "busbw", "model ms"):
        t.add_column(col, justify="left" if col == "collective" else "right")
    fits = {"allreduce": f.allreduce_fit, "allgather": f.allgather_fit}
    for s in sorted(c.samples, key=lambda s: (s.collective != "allreduce", s.n_bytes)):
        fit = fits[s.collective]
        t.add_row(s.collective, format_size(s.n_bytes), f"{s.wall_s * 1e3:.3f}", f"{s.cpu_s * 1e3:.3f}",
                  format_rate(s.algbw_bps), format_rate(s.busbw_bps),
                  f"{(fit.intercept + fit.slope * s.n_bytes) * 1e3:.3f}")  # fmt: skip
    return t



def calibration_summary(c: pm.Calibration) -> str:
    f = c.fitted
    eff = (
        f"efficiency {c.efficiency:.3f} of {format_rate(c.rate_bps)}"
        if c.efficiency is not None
        else ("efficiency not fitted (unshaped: no rate to compare with; the model takes it from a shaped calibration "
            "of the same cluster, else 1.0 or --efficiency)")
    )
    local = f" (local add_ probe {c.local_reduce_s_per_byte * 1e9:.3g} ns/B)" if c.local_reduce_s_per_byte else ""
    return (
        f"fitted: latency alpha {f.latency_s * 1e6:.3g} us, all-reduce bandwidth {format_rate(f.bandwidth_bps)} "
        f"(all-gather {format_rate(f.allgather_bandwidth_bps)}), {eff}; host cost {f.host_s_per_wire_byte * 1e9:.3g} "
        f"ns per byte on the wire, {f.reduce_s_per_byte * 1e9:.3g} ns per byte reduced{local}; beside compute a "
        f"collective takes {f.contention_latency_s * 1e6:.3g} us more per latency step and "
        f"{f.contention_s_per_wire_byte * 1e9:.3g} ns more per byte on the wire; in lockstep the slowest rank "
        f"finishes a step {c.skew_s * 1e3:.3g} ms after the median one; "
        f"fit residual {f.allreduce_fit.rel_rms:.1%} (all-reduce), {f.allgather_fit.rel_rms:.1%} (all-gather)"
        + (f"; measured beside {c.cross_traffic} cross-traffic flow{'s' * (c.cross_traffic != 1)} (used only for "
           f"trials with as many)" if c.cross_traffic else "")
    )



BOUND_SHORT = {"compute": "compute", "co-location": "co-location", "codec": "codec", "exposed communication": "comm",
               "host cost": "host", "skew": "skew", "floor": "floor"}  # fmt: skip


def _fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"



def prediction_view(data: dict[str, Any], profile: pm.Profile, terms: Any, source: str) -> list[Any]:
    """What `testbed predict` prints (rich renderables and lines, in order) for the data of modelling.prediction."""
    out: list[Any] = []
    names = list(data["compressors"])
    knobs = []
    if data["compute_speedup"] != 1:
        knobs.append(f"compute {data['compute_speedup']:g}x faster")
    if data["codec_speedup"] != 1:
        knobs.append(f"encode/decode {data['codec_speedup']:g}x faster")
    title = (
        f"{profile.model} bs{profile.batch_size} ({profile.device} profile), {data['world_size']} workers, "
        f"{terms.describe()}" + (f", what-if: {', '.join(knobs)}" if knobs else "")
        + (f", +{data['straggler_s'] * 1e3:.1f} ms per iteration waiting for the slowest rank"
           if data["straggler_s"] > 0 else "")
    )  # fmt: skip
    out.append(title)
    t = Table(title="predicted iteration time (ms), +- its interval, (what bound it)")
    t.add_column("bandwidth", justify="right")
    for n in names:
        t.add_column(n, justify="right")
    extrapolated = set(data.get("extrapolated_bps") or ())
    for i, b in enumerate(data["bandwidths_bps"]):
        cells = []
        for n in names:
            c = data["compressors"][n]
            best = min(data["compressors"][m]["iter_time_s"][i] for m in names)
            txt = _fmt_ms(c["iter_time_s"][i])
            if c.get("high_s") and c["high_s"][i] is not None:
                txt += f" +-{_fmt_ms((c['high_s'][i] - c['low_s'][i]) / 2)}"
            bound = BOUND_SHORT.get((c.get("bound_by") or [""] * (i + 1))[i], "")
            txt = f"[bold green]{txt}[/]" if c["iter_time_s"][i] == best else txt
            cells.append(f"{txt} ({bound})" if bound else txt)
        label = f"unshaped ({pm.rate_text(b)})" if b == data.get("unshaped_bps") else pm.rate_text(b)
        t.add_row(label + (" *" if b in extrapolated else ""), *cells)
    out.append(t)
    if extrapolated:
        out.append("* extrapolated: outside the calibrated rates (the nearest calibration's terms); "
                   "`testbed calibrate --bw` at these rates")  # fmt: skip
    if data.get("colocation") or data.get("profile_colocated_ranks", 1) > 1:
        out.append(f"co-location: profile measured with {data.get('profile_colocated_ranks', 1)} rank(s) computing "
                   f"at once; this cluster: {data.get('colocation') or 'ranks do not share cores'}")  # fmt: skip
    for w in data.get("warnings") or ():
        out.append(f"[yellow]warning:[/] {w}")
    for n in names:
        notes = [x for x in data["compressors"][n].get("floor_note") or () if x]
        if notes:
            out.append(f"{n}: {notes[0]}" + (f" (at {len(notes)} rates)" if len(notes) > 1 else ""))
    s = Table(
        title=f"speedup over {data['baseline']} and crossover bandwidth B* "
        f"({format_rate(min(data['bandwidths_bps']))}..{format_rate(max(data['bandwidths_bps']))})"
    )
    for col in (
        "compressor",
        f"speedup @ {format_rate(data['bandwidths_bps'][0])}",
        f"speedup @ {format_rate(data['bandwidths_bps'][-1])}",
        "best speedup",
        "crossover B*",
    ):
        s.add_column(col, justify="left" if col == "compressor" else "right")
    for n in names:
        c = data["compressors"][n]
        cx = c["crossover"]
        if cx is None:
            cx_txt = "(baseline)"
        elif cx["kind"] == "crossover":
            cx_txt = f"{pm.rate_text(cx['bandwidth_bps'])} (faster {'below' if cx['wins_below'] else 'above'})"
        else:
            cx_txt = f"{cx['kind']} faster"
        s.add_row(
            n,
            f"{c['speedup'][0]:.2f}x",
            f"{c['speedup'][-1]:.2f}x",
            f"{c['max_speedup']:.2f}x @ {pm.rate_text(c['max_speedup_at_bps'])}",
            cx_txt,
        )
    out.append(s)
    out.append(f"profile: {source}; hooks {'block' if data['hook_blocks_backward'] else 'overlap'} backward")
    for n in names:
        for a in data["compressors"][n].get("assumed") or ():
            out.append(f"assumed for {n}: {a}")
    return out
