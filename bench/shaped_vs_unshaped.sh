#!/bin/bash
# Does a shaped link make a co-located compressed setting faster than an unshaped one? (seed 10, configuration 2:
# 5 ranks on 2 cores ran Top-K 1438-1496 ms a step at 2 Gbit/s and 1602-1691 unshaped. Alternated, it was not so:
# 1469 ms unshaped against 1502 at 2 Gbit/s; docs/benchmarks.md, seed 10's section.)
#
#   bench/shaped_vs_unshaped.sh [ROUNDS]   (env: HOSTS MODEL BATCH BUCKET_MB COMPRESSOR RATE ITERS WARMUP)
#
# Brings up its own emulated cluster (svsu), then alternates the same trial unshaped and at RATE, ROUNDS times each
# (default 3), so that both sides sample the same stretch of the machine, and reads the whole machine's CPU time
# (/proc/stat: user, system, softirq, idle) around each trial. Prints one line per trial: rate, median step, forward +
# backward, exposed communication, and the trial's CPU split in % of the two cores. Takes the cluster down at the end
# (and on Ctrl-C). Needs root, as the bench does; run it alone (a loaded machine reads as a slower step).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$REPO/.venv/bin/python
ROUNDS=${1:-3}
[[ $ROUNDS =~ ^[1-9]$ ]] || { echo "shaped_vs_unshaped.sh: ROUNDS '$ROUNDS': expected 1-9" >&2; exit 2; }
HOSTS=${HOSTS:-5} MODEL=${MODEL:-resnet18} BATCH=${BATCH:-16} BUCKET_MB=${BUCKET_MB:-50}
COMPRESSOR=${COMPRESSOR:-topk} RATE=${RATE:-2gbit} ITERS=${ITERS:-12} WARMUP=${WARMUP:-10}
NAME=svsu
OUT=$(mktemp -d /var/tmp/svsu.XXXXXX)
tb() { (cd "$REPO" && "$PY" -m testbed.cli "$@"); }
trap 'tb down --name "$NAME" >/dev/null 2>&1 || true; rm -rf "$OUT"' EXIT  # also after a failure halfway
cpu() { awk '/^cpu /{print $2+$3, $4, $7+$8, $5+$6}' /proc/stat; }  # user+nice, system, irq+softirq, idle+iowait
tb up --name "$NAME" --hosts "$HOSTS" --recreate >/dev/null
echo "# $COMPRESSOR, $MODEL bs$BATCH, $HOSTS hosts, buckets $BUCKET_MB MB, $ITERS steps after $WARMUP; $(date -u +%FT%TZ)"
echo "rate | median step ms | forward + backward ms | exposed comm ms | user % | system % | softirq % | idle %"
for round in $(seq 1 "$ROUNDS"); do
  for rate in none "$RATE"; do
    dir=$OUT/$round-$rate
    read -r u0 s0 q0 i0 < <(cpu)
    tb sweep --name "$NAME" --bw "$rate" --compressor "$COMPRESSOR" --world-size "$HOSTS" --model "$MODEL" \
      --batch-size "$BATCH" --iters "$ITERS" --warmup-iters "$WARMUP" --seed "$round" --out "$dir" \
      --bucket-cap-mb "$BUCKET_MB" --yes >/dev/null
    read -r u1 s1 q1 i1 < <(cpu)
    # the stored row, as `testbed results` reads it (the trial's best attempt), not its files
    tb results --json "$dir" | "$PY" -c '
import json, sys
rate, *ticks = sys.argv[1:]
(s,) = json.load(sys.stdin)
status, error = s["status"], s["error"]
if status != "ok":
    sys.exit(f"shaped_vs_unshaped.sh: the trial at {rate} ended {status}: {error}")
t = [int(x) for x in ticks]
ms = [1e3 * s["iter_time_s_p50"], 1e3 * (s["forward_s"] + s["backward_s"]), 1e3 * s["comm_exposed_s"]]
print(" | ".join([rate, *(f"{x:.0f}" for x in ms), *(f"{100 * x / sum(t):.0f}" for x in t)]))
' "$rate" $((u1 - u0)) $((s1 - s0)) $((q1 - q0)) $((i1 - i0))
  done
done
