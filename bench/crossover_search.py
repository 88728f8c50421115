"""`testbed crossover` against a grid: for each compressor and world size, the trials and wall time of the search
and of a 7-rate grid over the same range, and whether the grid's crossover lies in the search's bracket (issue 34).
Then one trial's wall time split (docs/results-format.md, wall_*_s) with DDP's model broadcast and without it
(every rank built the same parameters, checked by checksum): the per-trial speed-up.

    python bench/crossover_search.py          # resnet18 64x64 bs32, powersgd/acpsgd/signsgd, 2 and 4 hosts, 10% (hours)
    python bench/crossover_search.py --world-sizes 2 --no-grid --no-split   # the searches alone (6 min here)
    python bench/crossover_search.py --model mlp --batch-size 8 --compressors acpsgd --world-sizes 2 \\
        --bw-range 2mbit..128mbit --precision 100% --iters 4 --split-bw 10mbit       # smoke run (minutes)

The search and the grid use separate results directories (the search reuses nothing of the grid); the grids of one
world size share one, so the baseline's grid runs once, and each grid's wall time is its trials' and the baseline's
(the rows' wall_s) summed. Prints Markdown
tables (paste into docs/benchmarks.md). Needs root; uses its own cluster name and removes it. Measure on a quiet
machine: 2 shared cores make every figure depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "benchcx"
OPTIONS = {"powersgd": ["--rank", "4"], "acpsgd": ["--rank", "4"]}
SPLIT = ("wall_shape_s", "wall_probe_s", "wall_rank_start_s", "wall_model_sync_s", "wall_warmup_s", "wall_measured_s")


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"testbed {' '.join(args[:3])}: {done.stderr.strip()[-800:]}")
    return done


def log_rates(text: str, n: int) -> list[str]:
    from shaping.units import format_rate
    from testbed.crossover_cli import parse_range

    lo, hi = parse_range(text)
    return [format_rate(lo * (hi / lo) ** (i / (n - 1)), 3) for i in range(n)]


def grid_crossover(out: Path, compressor: str, ws: int, against: str) -> tuple[str, float | None]:
    from testbed.report.analysis import measured_crossover
    from testbed.results import load_results

    df = load_results(out)
    df = df[(df["status"] == "ok") & (df["world_size"] == ws)]
    t = {(r.compressor, r.rate_bps): r.iter_time_s_p50 for r in df.itertuples()}
    rates = sorted(r for c, r in t if c == compressor and (against, r) in t)
    return measured_crossover(rates, [t[(against, r)] / t[(compressor, r)] for r in rates])


def agrees(grid_kind: str, grid_bps: float | None, search: dict, bw_range: tuple[int, int]) -> str:
    """Whether the search's answer agrees with the grid's: the grid's crossover inside the search's bracket (or its
    tie's band), the same "always"/"never", or a tie whose band reaches the end of the range where the grid, one run
    of each side a rate, says the compressor still wins ("always": the top) or still loses ("never": the bottom)."""
    if grid_kind == "-":
        return "-"
    lo, hi = search["bracket_bps"]
    if grid_bps is not None:
        return "yes" if lo <= grid_bps <= hi else "no"
    if grid_kind == search["kind"]:
        return "yes"
    low_end, high_end = bw_range
    if search["kind"] == "tie" and ((grid_kind == "always" and hi >= high_end) or (grid_kind == "never" and lo <= low_end)):
        return "yes (a tie reaching the range's end)"
    return "no"


def grid_wall_s(out: Path, compressor: str, ws: int, against: str) -> float:
    """The grid's cost for one compressor: the wall time of its trials and the baseline's, summed from the rows
    (the baseline's rows are shared by the compressors of one world size, and each grid is charged for them)."""
    from testbed.results import load_results

    df = load_results(out)
    return float(df[(df["world_size"] == ws) & df["compressor"].isin([compressor, against])]["wall_s"].sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--image-size", default="64")
    ap.add_argument("--compressors", default="powersgd,acpsgd,signsgd")
    ap.add_argument("--against", default="syncsgd")
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--bw-range", default="50mbit..5gbit", help="locally meaningful: about 10 Mbit to 5 Gbit")
    ap.add_argument("--grid-rates", type=int, default=7)
    ap.add_argument("--precision", default="10%")
    ap.add_argument("--iters", default="10")
    ap.add_argument("--warmup-iters", default="5")
    ap.add_argument("--split-bw", default="10mbit", help="the rate of the per-trial split (before/after)")
    ap.add_argument("--out", help="keep the results here (default: a temporary directory)")
    ap.add_argument("--no-grid", action="store_true", help="the searches alone (their grid columns read '-'), e.g. to "
                    "measure a change of the search against grids already in docs/benchmarks.md")
    ap.add_argument("--no-split", action="store_true", help="skip the per-trial split (before/after) at the end")
    a = ap.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="bench-crossover-"))
    trial = ["--model", a.model, "--batch-size", a.batch_size, "--image-size", a.image_size, "--iters", a.iters,
             "--warmup-iters", a.warmup_iters, "--no-probe"]  # fmt: skip
    sizes = [int(w) for w in a.world_sizes.split(",")]
    cli("up", "--name", NAME, "--hosts", str(max(sizes)))
    lines = ["| compressor | hosts | search: answer | bracket | trials | wall | grid (7 rates): crossover | trials | "
             "wall | grid's crossover in the bracket |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    try:
        for ws in sizes:
            for comp in a.compressors.split(","):
                opts = OPTIONS.get(comp, [])
                grid_out = root / f"grid-{ws}" / "results"  # one per world size: the baseline's trials run once
                grid_out.parent.mkdir(parents=True, exist_ok=True)
                kind, g_bps, grid_wall = "-", None, 0.0
                if not a.no_grid:
                    cli("sweep", "--name", NAME, "--bw", ",".join(log_rates(a.bw_range, a.grid_rates)),
                        "--compressor", f"{a.against},{comp}", "--world-size", str(ws), "--out", str(grid_out),
                        *trial, *opts)  # fmt: skip
                    kind, g_bps = grid_crossover(grid_out, comp, ws, a.against)
                    grid_wall = grid_wall_s(grid_out, comp, ws, a.against)
                search_out = root / f"search-{comp}-{ws}" / "results"
                search_out.parent.mkdir(parents=True, exist_ok=True)
                t0 = time.monotonic()
                done = cli("crossover", "--name", NAME, "--compressor", comp, "--against", a.against, "--world-size",
                           str(ws), "--bw-range", a.bw_range, "--precision", a.precision, "--out", str(search_out),
                           "--json", *trial, *opts)  # fmt: skip
                wall = time.monotonic() - t0
                (s,) = json.loads(done.stdout)["searches"]
                lo, hi = s["bracket_bps"]
                from testbed.crossover_cli import parse_range

                inside = agrees(kind, g_bps, s, parse_range(a.bw_range))
                from shaping.units import format_rate

                g_text = format_rate(g_bps, 3) if g_bps else kind
                grid_cells = "- | - | -" if a.no_grid else f"{g_text} | {2 * a.grid_rates} | {grid_wall:.0f} s"
                lines.append(f"| {comp} | {ws} | {s['kind']} | {format_rate(lo, 3)}..{format_rate(hi, 3)} | "
                             f"{s['trials']} | {wall:.0f} s | {grid_cells} | {inside} |")  # fmt: skip
                print(lines[-1], flush=True)
        split = "" if a.no_split else split_rows(root, trial, a.split_bw)
    finally:
        cli("down", "--name", NAME, check=False)
    print("\n".join(lines))
    print()
    print(split)
    print(f"\nresults: {root}")
    return 0


def split_rows(root: Path, trial: list[str], bw: str) -> str:
    """One sync SGD trial at `bw` with DDP's broadcast (before) and with the checksum instead (after)."""
    from testbed.results import load_results

    rows = {}
    for mode, env in (("before (broadcast)", ["--env", "TESTBED_DDP_INIT_SYNC=broadcast"]), ("after (checksum)", [])):
        out = root / f"split-{mode.split()[0]}"
        cli("run", "--name", NAME, "--bw", bw, "--compressor", "syncsgd", "--out", str(out), *trial, *env)
        (rows[mode],) = load_results(out).to_dict("records")
    head = "| trial | " + " | ".join(c.removeprefix("wall_").removesuffix("_s") for c in SPLIT)
    out = [head + " | teardown | wall | iter p50 |", "|---" * (len(SPLIT) + 4) + "|"]
    for mode, r in rows.items():
        cells = " | ".join(f"{r[c]:.1f} s" if r[c] is not None and not math.isnan(r[c]) else "-" for c in SPLIT)
        out.append(f"| {mode} at {bw} | {cells} | {r['wall_teardown_s']:.1f} s | {r['wall_s']:.1f} s | "
                   f"{r['iter_time_s_p50'] * 1e3:.0f} ms |")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
