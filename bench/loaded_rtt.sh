#!/bin/bash
# Loaded RTT under cross traffic (issue 36, docs/topologies.md "What the queue costs"): on a 2-host emulated cluster
# at each RATE, K bidirectional iperf3 flows h0<->h1 for 8 s (each under `timeout`), and `ping -c 12 -i 0.2` h0->h1
# from the 3rd second. Needs root; uses its own cluster name and removes it. Bounded: 2 rates x 3 flow counts x ~9 s.
#   sudo bench/loaded_rtt.sh [RATE ...]        # default: 20mbit 100mbit
set -u
cd "$(dirname "$0")/.."
NAME=benchrtt
RATES=("${@:-20mbit 100mbit}")
trap '.venv/bin/testbed down --name $NAME >/dev/null 2>&1' EXIT
for R in ${RATES[*]}; do
  .venv/bin/testbed up --name $NAME --hosts 2 --bw "$R" --recreate >/dev/null || { echo "testbed up failed" >&2; exit 1; }
  for K in 0 1 4; do
    pids=()
    for k in $(seq 1 $K); do
      ip netns exec tb-$NAME-h1 timeout 20 iperf3 -s -1 -p $((5990 + k)) >/dev/null 2>&1 & pids+=($!)
    done
    for k in $(seq 1 $K); do  # each server listens (polled, at most 5 s)
      for _ in $(seq 100); do
        ip netns exec tb-$NAME-h1 ss -Hltn "sport = :$((5990 + k))" | grep -q . && break
        sleep 0.05
      done
    done
    for k in $(seq 1 $K); do
      ip netns exec tb-$NAME-h0 timeout 15 iperf3 -c 10.77.0.2 -p $((5990 + k)) --bidir -t 8 -i 0 >/dev/null 2>&1 &
      pids+=($!)
    done
    sleep 3  # the flows reach their standing queue
    echo "$R flows=$K $(ip netns exec tb-$NAME-h0 ping -c 12 -i 0.2 10.77.0.2 | tail -1)"
    wait "${pids[@]}" 2>/dev/null
  done
done
