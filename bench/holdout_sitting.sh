#!/bin/bash
# One sitting of a held-out seed (issue 32, bench/model_accuracy.py --holdout): a seed takes hours longer than a
# working session, and the machine a session runs on is fresh each time, so a seed's progress lives in the repository
# between sittings, as bench/holdout_runs/seed<SEED>.tar.xz (its --out folder: plan, calibrations, profiles, trials).
#
#   bench/holdout_sitting.sh SEED MINUTES [--dir DIR] [--store DIR] [--ledger FILE] [--machine ID] [--slack PCT]
#                            [-- BENCH_ARGS...]
#
# - unpacks the seed's stored progress (from --store, default bench/holdout_runs) into DIR/seed<SEED> (default DIR:
#   /var/tmp/gc-holdout) unless it is there; a folder that is there must be the one the archive was packed from (its
#   stamp, DIR/seed<SEED>/packed, written at each packing, is the archive's), else the sitting is refused: an archive
#   committed from another machine's sitting would otherwise lose to an older folder here;
# - runs the bench from a clone of this repository at the commit the model was frozen at (the plan's, or HEAD for a
#   seed's first sitting), with PYTHONPATH set to the clone: the frozen model, not the checkout's, is what is judged;
# - one machine per configuration: its calibrations, profiles and trials are compared with each other, so they must
#   come from one machine (seed 4's configuration 5, begun in one session and resumed in the next, on a fresh machine,
#   read 898 and 846 ms of forward + backward a profile launch on the first and 581 and 582 on the second). Each
#   configuration's folder is stamped with the machine that began it (DIR/seed<SEED>/config<N>/machine: this boot's
#   /proc/sys/kernel/random/boot_id, or --machine ID); an unfinished one stamped otherwise, or not at all, is set
#   aside (DIR/seed<SEED>/set-aside/config<N>-<TIME>, its log beside it) and runs again from the start. A finished
#   configuration is never touched;
# - after MINUTES sends SIGINT to the bench's process group (the trial in flight is lost, its cluster taken down);
#   and sooner, at a configuration's start, when the plan's estimate of it times --slack PCT (default 150: seed 4's
#   configurations took 1.2-1.45 times their estimates) is more than the minutes left: a configuration cut off would be
#   set aside by the next sitting, on the next machine, and its part lost. The configuration stopped at its start is
#   removed (seconds of it had run);
# - packs the progress back into the archive, and once the seed is finished copies its ledger line into
#   --ledger (default bench/holdout_results.jsonl). Commit both.
# BENCH_ARGS (e.g. --configs 7 --with-issue-config --iters 6 --repeats 2 --min-measured-s 8) are needed on the first
# sitting only: they are kept beside the plan (sitting-args) and reused. Needs root, as the bench does.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "holdout_sitting.sh: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "expected SEED MINUTES [--dir DIR] [--store DIR] [--ledger FILE] [--machine ID] [--slack PCT] [-- BENCH_ARGS...]"
SEED=$1 MINUTES=$2
shift 2
[[ $SEED =~ ^[0-9]{1,9}$ ]] || die "SEED '$SEED': expected a non-negative integer"
[[ $MINUTES =~ ^[0-9]{1,4}$ ]] && [ "$MINUTES" -ge 1 ] || die "MINUTES '$MINUTES': expected an integer 1-9999"
DIR=/var/tmp/gc-holdout STORE=$REPO/bench/holdout_runs LEDGER=$REPO/bench/holdout_results.jsonl MACHINE= SLACK=150
while [ $# -gt 0 ]; do
  case $1 in
    --dir) [ $# -ge 2 ] || die "--dir: expected a folder"; DIR=$2; shift 2 ;;
    --store) [ $# -ge 2 ] || die "--store: expected a folder"; STORE=$2; shift 2 ;;
    --ledger) [ $# -ge 2 ] || die "--ledger: expected a file"; LEDGER=$2; shift 2 ;;
    --machine) [ $# -ge 2 ] || die "--machine: expected an ID"; MACHINE=$2; shift 2 ;;
    --slack) [ $# -ge 2 ] || die "--slack: expected a percentage"; SLACK=$2; shift 2 ;;
    --) shift; break ;;
    *) die "'$1': expected --dir DIR, --store DIR, --ledger FILE, --machine ID, --slack PCT or -- BENCH_ARGS..." ;;
  esac
done
[[ $DIR = /* ]] || die "--dir '$DIR': expected an absolute path"
[[ $STORE = /* ]] || die "--store '$STORE': expected an absolute path"
[[ $LEDGER = /* ]] || die "--ledger '$LEDGER': expected an absolute path"
[[ $SLACK =~ ^[0-9]{1,4}$ ]] && [ "$SLACK" -ge 1 ] || die "--slack '$SLACK': expected a percentage 1-9999 (150: 1.5 times the estimate)"
[ -n "$MACHINE" ] || MACHINE=$(cat /proc/sys/kernel/random/boot_id)
[[ $MACHINE =~ ^[A-Za-z0-9-]{1,64}$ ]] || die "--machine '$MACHINE': expected 1-64 letters, digits or dashes"
ARCHIVE=$STORE/seed$SEED.tar.xz
WORK=$DIR/seed$SEED CLONE=$DIR/clone$SEED
PY=$REPO/.venv/bin/python
[ -x "$PY" ] || die "$PY: not found; run 'make venv' first"
if [ -f "$WORK/sitting-args" ] || [ -f "$ARCHIVE" ]; then  # started: its arguments were kept with it
  [ $# -eq 0 ] || die "seed $SEED has started (in $ARCHIVE or $WORK): its bench arguments are kept there; give none"
else
  [ $# -gt 0 ] || die "seed $SEED has not started: give its bench arguments after --"
fi
if [ ! -d "$WORK" ] && [ -f "$ARCHIVE" ]; then
  mkdir -p "$DIR"
  tar -xJf "$ARCHIVE" -C "$DIR"
elif [ -d "$WORK" ] && [ -s "$ARCHIVE" ]; then  # both: the folder here must be the archive's (or ahead of it)
  STORED=$(tar -xJOf "$ARCHIVE" "seed$SEED/packed" 2>/dev/null || true)
  HERE=$(cat "$WORK/packed" 2>/dev/null || true)
  [ "$STORED" = "$HERE" ] || die "$WORK (packed ${HERE:-never}) is not what $ARCHIVE holds (packed ${STORED:-before stamps}); move $WORK aside to resume from the archive"
fi
if [ $# -eq 0 ]; then mapfile -t ARGS < "$WORK/sitting-args"; else ARGS=("$@"); fi
if [ -f "$WORK/holdout.json" ]; then
  COMMIT=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"])' "$WORK/holdout.json")
else
  [ -z "$(git -C "$REPO" status --porcelain testbed/perfmodel)" ] || die "testbed/perfmodel has uncommitted changes; freeze the model in a commit first"
  COMMIT=$(git -C "$REPO" rev-parse HEAD)
fi
[[ $COMMIT =~ ^[0-9a-f]{40}$ ]] || die "frozen commit '$COMMIT' in $WORK/holdout.json: expected a clean commit"
if [ ! -d "$CLONE/.git" ]; then
  git clone -q "$REPO" "$CLONE"
fi
git -C "$CLONE" checkout -q "$COMMIT"
mkdir -p "$WORK"
printf '%s\n' "${ARGS[@]}" > "$WORK/sitting-args"
# one machine per configuration (see above): an unfinished configuration begun elsewhere runs again from the start
declare -A FOUND=()  # the configurations there before this sitting (one begun here is stamped at its end)
for d in "$WORK"/config[0-9]*; do
  [ -d "$d" ] || continue
  BEGUN=$(cat "$d/machine" 2>/dev/null || echo "an unknown machine")
  if [ -f "$d/report/prediction_error.csv" ] || [ "$BEGUN" = "$MACHINE" ]; then FOUND[$d]=1; continue; fi
  ASIDE=$WORK/set-aside/${d##*/}-$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$WORK/set-aside"
  mv "$d" "$ASIDE"
  if [ -f "$d.md" ]; then mv "$d.md" "$ASIDE.md"; fi
  echo "${d##*/} was begun on $BEGUN, not this one ($MACHINE): set aside in $ASIDE; it runs again from the start"
done

# the plan's estimate of configuration $1 in seconds, from the frozen clone's bench (nothing when it has none)
estimate_s() {
  (cd "$CLONE" && PYTHONPATH="$CLONE" "$PY" - "$WORK/holdout.json" "$1" 2>/dev/null <<'EOF'
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("model_accuracy", "bench/model_accuracy.py")
ma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ma)
p = json.load(open(sys.argv[1]))
c = p["configs"][int(sys.argv[2]) - 1]
again = {k: p[k] for k in ("relaunch_beyond_pct", "max_launches") if k in p}  # a later plan's (an older bench: neither)
print(round(ma.estimate_wall_s(c, p["iters"], p["repeats"], p["warmup_iters"], p["min_measured_s"], **again)))
EOF
  ) || true
}
# stop at a configuration's start (its log, config<N>.md, appears) when it would not finish before the deadline
watch_starts() {
  local md n est left
  declare -A seen=()
  for md in "$WORK"/config[0-9]*.md; do seen[$md]=1; done  # begun before this sitting: resumed, not judged
  while kill -0 "$BENCH" 2>/dev/null; do
    for md in "$WORK"/config[0-9]*.md; do
      [ -f "$md" ] && [ -z "${seen[$md]:-}" ] || continue
      seen[$md]=1
      n=${md##*/config}; n=${n%.md}
      est=$(estimate_s "$n")
      [[ $est =~ ^[0-9]+$ ]] || continue
      left=$(( DEADLINE - $(date +%s) ))
      if [ $(( est * SLACK / 100 )) -gt "$left" ]; then
        echo "holdout_sitting.sh: configuration $n is estimated at $(( est / 60 )) min (x$SLACK %), and $(( left / 60 )) min are left: stopping before it"
        echo "$n" > "$WORK/.stopped-before"
        kill -INT "$BENCH" 2>/dev/null || true
        return
      fi
    done
    read -rt 5 <> <(:) || true  # poll every 5 s (read's own timeout: no sleep child left behind)
  done
}

# timeout runs the bench in a process group of its own and at the deadline sends SIGINT to all of it, as a terminal's
# Ctrl-C would; a SIGINT or SIGTERM here is passed on to it the same way
cd "$CLONE"
rm -f "$WORK/.stopped-before"
DEADLINE=$(( $(date +%s) + MINUTES * 60 ))
timeout -s INT "${MINUTES}m" env PYTHONPATH="$CLONE" "$PY" bench/model_accuracy.py --holdout "$SEED" "${ARGS[@]}" \
  --out "$WORK" &
BENCH=$!
watch_starts &
WATCHER=$!
trap 'kill -INT "$BENCH" 2>/dev/null || true' INT TERM
rc=0
wait "$BENCH" || rc=$?
while kill -0 "$BENCH" 2>/dev/null; do wait "$BENCH" || rc=$?; done  # a trapped signal ends the first wait early
kill "$WATCHER" 2>/dev/null || true
wait "$WATCHER" 2>/dev/null || true
if [ -f "$WORK/.stopped-before" ]; then  # stopped at its start: seconds of it ran; the next sitting runs it whole
  n=$(cat "$WORK/.stopped-before")
  rm -rf "$WORK/config$n" "$WORK/config$n.md" "$WORK/.stopped-before"
  echo "configuration $n: not begun in this sitting (removed); the next sitting runs it"
fi

for d in "$WORK"/config[0-9]*; do  # the configurations this sitting began: stamped with this machine
  if [ -d "$d" ] && [ -z "${FOUND[$d]:-}" ]; then echo "$MACHINE" > "$d/machine"; fi
done
mkdir -p "$(dirname "$ARCHIVE")"
echo "$(date -u +%FT%TZ) $(hostname) $$" > "$WORK/packed"  # which packing this folder and the archive are
tar -cJf "$ARCHIVE.part" -C "$DIR" "seed$SEED" && mv "$ARCHIVE.part" "$ARCHIVE"
LINE=$(grep -h "^{\"seed\": $SEED," "$CLONE/bench/holdout_results.jsonl" 2>/dev/null || true)
if [ "$rc" -eq 0 ] && [ -n "$LINE" ] && ! grep -qs "^{\"seed\": $SEED," "$LEDGER"; then
  printf '%s\n' "$LINE" >> "$LEDGER"
  echo "seed $SEED finished: its line is in $LEDGER"
fi
echo "seed $SEED: progress in $ARCHIVE (bench exit $rc); commit it"
