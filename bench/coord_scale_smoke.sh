#!/bin/sh
# CTest smoke run of coord_scale_bench at a small size: the JSON has every
# key scripts rely on and at least one step committed. No timing threshold.
set -eu
out=$("$1" --nodes 64 --ranks-per-node 8 --interval-s 1 --duration-s 6 --json)
echo "$out"
for key in nodes ranks commit_p50_s commit_p99_s detect_s plan_s plan_orders reports_per_s \
           coordinator_cpu_cores coordinator_rss_bytes steps_committed; do
  echo "$out" | grep -q "\"$key\": " || { echo "missing key $key" >&2; exit 1; }
done
echo "$out" | grep -q '"steps_committed": [1-9]' || { echo "no step committed" >&2; exit 1; }
