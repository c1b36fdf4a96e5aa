#!/bin/sh
# CTest smoke run of coord_scale_bench at a small size, its nodes split over
# two simulator processes: the JSON has every key scripts rely on, at least
# one step committed and both simulators' heartbeats merged. No timing
# threshold.
set -eu
out=$("$1" --nodes 64 --ranks-per-node 8 --interval-s 1 --duration-s 6 --quiet-s 1 --processes 2 --json)
echo "$out"
for key in nodes ranks commit_p50_s commit_p99_s detect_s plan_s plan_orders reports_per_s \
           coordinator_cpu_cores coordinator_rss_bytes steps_committed processes \
           sim_late_p99_s sim_late_max_s coordinator_cpu_us_per_heartbeat \
           coordinator_cpu_us_per_report model_coordinator_cores; do
  echo "$out" | grep -q "\"$key\": " || { echo "missing key $key" >&2; exit 1; }
done
echo "$out" | grep -q '"steps_committed": [1-9]' || { echo "no step committed" >&2; exit 1; }
echo "$out" | grep -q '"processes": 2,' || { echo "not two simulators" >&2; exit 1; }
echo "$out" | grep -q '"sim_heartbeats": [1-9]' || { echo "no heartbeat merged" >&2; exit 1; }
