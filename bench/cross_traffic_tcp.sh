#!/bin/bash
# What PowerSGD pays beside cross traffic is it TCP's restart after idle, or loss? (issue 36, docs/topologies.md)
# On a 4-host emulated cluster at 100 Mbit/s, one PowerSGD trial of ResNet-18 with --cross-traffic 4, three times:
# with the kernel's default restart after idle, with net.ipv4.tcp_slow_start_after_idle=0 in every host namespace,
# and with the default again, printing each trial's median iteration time and loaded RTT, and for the last two the
# TCP counters (nstat: timeouts, retransmitted segments) of h0 and h1 over the trial and the qdiscs' drops.
# Needs root; uses its own cluster name and removes it. Bounded: 3 trials of 8 iterations (about 90 s each).
#   sudo bench/cross_traffic_tcp.sh
set -u
cd "$(dirname "$0")/.."
NAME=benchtcp
OUT=$(mktemp -d)
T=.venv/bin/testbed
trap '$T down --name $NAME >/dev/null 2>&1; rm -rf "$OUT"' EXIT
$T up --name $NAME --hosts 4 --bw 100mbit --recreate >/dev/null || { echo "testbed up failed" >&2; exit 1; }
trial() {  # $1: label
  $T run --name $NAME --bw 100mbit --compressor powersgd --model resnet18 --iters 6 --warmup-iters 2 --no-probe \
    --cross-traffic 4 --json --rerun --out "$OUT" \
    | .venv/bin/python -c "import json, sys; r = json.load(sys.stdin)['row']; print('$1: iteration', \
round(r['iter_time_s_p50'], 3), 's, loaded RTT', round(r['loaded_rtt_s'] * 1e3, 1), 'ms')"
}
sysctl_all() { for h in h0 h1 h2 h3; do $T exec --name $NAME $h -- sysctl -qw net.ipv4.tcp_slow_start_after_idle=$1; done; }
counters() { for h in h0 h1; do echo "  $h: $($T exec --name $NAME $h -- nstat -a TcpExtTCPTimeouts TcpRetransSegs \
  | awk 'NR > 1 {printf "%s %s  ", $1, $2}')"; done; }
sysctl_all 1
trial "restart after idle on"
sysctl_all 0
for h in h0 h1; do $T exec --name $NAME $h -- nstat -n; done
trial "restart after idle off"
counters
sysctl_all 1
for h in h0 h1; do $T exec --name $NAME $h -- nstat -n; done
trial "restart after idle on"
counters
echo "qdisc drops since up (each host link: upload/download):"
$T status --name $NAME --json | .venv/bin/python -c "import json, sys
print('  ' + ', '.join(f\"{h['name']} {h['links']['upload']['drops']}/{h['links']['download']['drops']}\"
                       for h in json.load(sys.stdin)['hosts']))"
