#!/usr/bin/env bash
# The end-to-end demo: a 4-rank data-parallel ckpt-worker job on a 3-node
# cluster simulated on this machine (ckpt-coordinator; nodes a and b with 2
# ranks each; spare c), all under one fresh temp dir in /var/tmp.
#   1. reference: the same job undisturbed (4 ranks started by hand, no
#      checkpoints) gives the expected params_digest;
#   2. disturbed: one trainer of node a is SIGKILLed mid-run and restarted
#      from shared memory; later node b dies whole (ckptrun's process group,
#      its ckptd and its /dev/shm arenas) and spare c takes ranks 2,3 from the
#      shared root; the job runs to its last step;
#   3. check: every rank's final params_digest equals the reference (exit 1
#      otherwise), then a report of steps lost, save cost and recovery times,
#      and per failure how many surviving ranks kept their process (an
#      in-process restart: ckpt-worker does it by default under a ckptrun
#      that keeps trainers).
# Uses the binaries in ${BUILD_DIR:-build} (scripts/build.sh). STEPS (default
# 100) sets the job length; KEEP=1 keeps the temp dir (kept anyway on failure).
# TRAINER=torch (scripts/demo_torch.sh) runs the same job as a PyTorch
# program instead: examples/train_gpt.py (gloo data parallel, ckpt.torch).
# WARM=N (default 0) runs every ckptrun with --warm N: N trainer processes
# started ahead per node take the ranks started anew after a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
coordinator_bin=$build/coordinator/ckpt-coordinator
ckptd_bin=$build/daemon/ckptd
ckptrun_bin=$build/tools/ckptrun
ckptctl_bin=$build/tools/ckptctl
worker_bin=$build/worker/ckpt-worker
torch_job=""
[[ ${TRAINER:-worker} != torch ]] || torch_job=1
needed=("$coordinator_bin" "$ckptd_bin" "$ckptrun_bin" "$ckptctl_bin")
[[ -n $torch_job ]] || needed+=("$worker_bin")
for b in "${needed[@]}"; do
  [[ -x $b ]] || { echo "demo: $b is not built (run scripts/build.sh)" >&2; exit 2; }
done

steps=${STEPS:-100}
ckpt_every=5
world=4
job=demo
heartbeat_ms=2000
warm=${WARM:-0}
[[ $warm =~ ^[0-9]+$ ]] || { echo "demo: WARM=$warm is not a count" >&2; exit 2; }
worker_args=(--steps "$steps" --seed 7 --ckpt-every "$ckpt_every" --log-every 1 --cpu-threads 1
             --vocab 256 --dim 128 --layers 2 --seq 32 --batch 32
             --connect-timeout-s 60 --collective-timeout-s 30)
trainer=ckpt-worker   # the trainer's process name
trainer_cmd=("$worker_bin" "${worker_args[@]}")
trainer_pace=()       # extra arguments under ckptrun
pace_ms=0             # the pause of trainer_pace per step
# ckptrun serves every generation's rendezvous store, not rank 0's trainer.
rendezvous=(--rendezvous worker)
if [[ -n $torch_job ]]; then
  trainer=python3
  trainer_cmd=("${PYTHON:-/usr/bin/python3}" "$PWD/examples/train_gpt.py" --steps "$steps" --seed 7
               --ckpt-every "$ckpt_every" --threads 1 --timeout-s 30 --device "${DEVICE:-cpu}")
  # The small GPT steps faster than this script finds its victim in /proc
  # on a busy machine: paced, so each failure lands where it is planned.
  pace_ms=300
  trainer_pace=(--step-sleep-ms "$pace_ms")
  rendezvous=(--rendezvous torch --rendezvous-python "${PYTHON:-/usr/bin/python3}")
fi

work=$(mktemp -d /var/tmp/ckptd-demo.XXXXXX)
shm_tag="ckptdemo-$$"  # every shm prefix of the demo starts with this
pgids=()               # process groups started here, killed on exit
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # One redirection around the kills and the wait: bash reports a job killed
  # by a signal ("Killed") whenever it reaps it, also between two commands.
  {
    for g in "${pgids[@]}"; do kill -KILL -- "-$g" || true; done
    wait || true
  } 2>/dev/null
  rm -f /dev/shm/"$shm_tag"-*
  if ((rc == 0)) && [[ -z ${KEEP:-} ]]; then
    rm -rf "$work"
  else
    echo "demo: logs kept in $work" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
# A command that fails under set -e says where (else the demo ends silently).
trap 'echo "demo: line $LINENO: a command failed (status $?)" >&2' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "demo: FAILED: $*" >&2
  exit 1
}
now() { echo "$EPOCHREALTIME"; }
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", (b - a) * 1000 }'; }

# Starts "$@" as the leader of a new process group (setsid does not fork:
# a background child of this shell is never a group leader); sets $started.
spawn() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 &
  started=$!
  pgids+=("$started")
}

# Like spawn, with every output line prefixed by its wall-clock time
# ($EPOCHREALTIME), so recovery can be timed from the trainers' logs.
spawn_stamped() {
  local log=$1
  shift
  setsid bash -c 'set -o pipefail
    "$@" 2>&1 | while IFS= read -r line; do printf "%s %s\n" "$EPOCHREALTIME" "$line"; done' \
    stamped "$@" >"$log" 2>&1 &
  started=$!
  pgids+=("$started")
}

# Polls `cond` (a command) every 0.1 s for up to $1 seconds.
wait_for() {
  local timeout=$1
  shift
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# Pids of processes named $1 whose parent is $2 (from /proc: no procps
# needed; no fork per process either: on a loaded machine with many
# processes a scan that forks for each one takes longer than the run).
children_named() {
  local name=$1 parent=$2 kids="" p comm stat rest d
  kids=$({ cat /proc/"$parent"/task/*/children; } 2>/dev/null) || kids=""
  if [[ -n $kids ]]; then
    for p in $kids; do
      { read -r comm <"/proc/$p/comm"; } 2>/dev/null || continue
      [[ $comm == "$name" ]] && echo "$p"
    done
    return 0
  fi
  for d in /proc/[0-9]*; do
    { read -r stat <"$d/stat"; } 2>/dev/null || continue
    [[ $stat == *"($name) "* ]] || continue
    rest=${stat##*) }
    read -r _ ppid _ <<<"$rest"
    [[ $ppid == "$parent" ]] && echo "${d#/proc/}"
  done
  return 0
}

# True once process $1 has exited (gone, or a zombie not yet waited for).
exited() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat:0:1} == Z ]]
}

# Highest "step N" a trainer printed in the given logs (0 if none).
max_step() {
  cat "$@" 2>/dev/null | awk '$2 == "step" && $4 == "loss" && $3 > m { m = $3 } END { print m + 0 }'
}

# ---------------------------------------------------------------------------
echo "== ckptd demo: job \"$job\", world size $world, $steps steps, checkpoint every $ckpt_every steps"
echo "   work dir $work"
# Ports: reference base, cluster base + 1 .. + 999; all below the ephemeral
# range (32768+), where a rank probing a store not yet listening can be
# handed the store's own port and connect to itself.
master_base=$((20000 + (RANDOM % 110) * 100))

echo
echo "== 1. reference run: $world ranks by hand, undisturbed, no checkpoints"
mkdir -p "$work/reference"
ref_t0=$(now)
ref_pids=()
for ((r = 0; r < world; ++r)); do
  RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$master_base \
    "${trainer_cmd[@]}" >"$work/reference/rank-$r.log" 2>&1 &
  ref_pids+=($!)
done
for ((r = 0; r < world; ++r)); do
  wait "${ref_pids[r]}" || fail "reference rank $r exited non-zero: $(tail -n 3 "$work/reference/rank-$r.log")"
done
ref_t1=$(now)
ref_digest=$(sed -n 's/^done rank=0 step [0-9]* params_digest=\([0-9a-f]*\)$/\1/p' "$work/reference/rank-0.log")
[[ -n $ref_digest ]] || fail "reference rank 0 printed no params_digest"
ref_s=$(awk -v a="$ref_t0" -v b="$ref_t1" 'BEGIN { printf "%.1f", b - a }')
echo "   $steps steps in $ref_s s; params_digest=$ref_digest"

# ---------------------------------------------------------------------------
echo
echo "== 2. disturbed run: coordinator, nodes a and b (2 ranks each), spare c"
shared=$work/shared
mkdir -p "$shared"
# --health-min-ratio 0: the simulated nodes share this machine's memory, so
# comparing their bandwidth would judge the load of the moment, not a node.
spawn "$work/coordinator.log" "$coordinator_bin" --listen 127.0.0.1:0 --state "$work/coordinator" \
  --shared-root "$shared" --heartbeat-timeout-ms "$heartbeat_ms" --insecure \
  --health-min-ratio 0
coordinator_pid=$started
wait_for 20 grep -q '^listening on ' "$work/coordinator.log" ||
  fail "ckpt-coordinator did not start: $(cat "$work/coordinator.log")"
coord=$(sed -n 's/^listening on \(.*\)$/\1/p' "$work/coordinator.log")
ctl() { "$ckptctl_bin" --coordinator "$coord" "$@"; }
cluster_json() { ctl cluster --json 2>/dev/null || true; }
job_field() { cluster_json | grep -o "\"$1\":[^,]*" | awk 'NR == 1' | cut -d: -f2-; }
node_alive() { cluster_json | grep -q "\"node_id\":\"$1\",[^}]*\"health\":\"ALIVE\""; }
echo "   ckpt-coordinator on $coord (heartbeat timeout $heartbeat_ms ms)"

declare -A daemon_pid launcher_pgid
start_node() {
  local id=$1
  shift
  local dir=$work/node-$id
  mkdir -p "$dir"
  spawn "$dir/ckptd.log" "$ckptd_bin" --socket "$dir/ckptd.sock" --root "$dir/root" \
    --shared-root "$shared" --coordinator "$coord" --node-id "$id" --advertise-addr 127.0.0.1 \
    --capacity 2 --shm-prefix "$shm_tag-$id" "$@"
  daemon_pid[$id]=$started
  wait_for 20 node_alive "$id" || fail "ckptd of node $id did not join: $(tail -n 5 "$dir/ckptd.log")"
}
start_launcher() {
  local id=$1 dir=$work/node-$1
  spawn_stamped "$dir/ckptrun.log" "$ckptrun_bin" --coordinator "$coord" --node-id "$id" \
    --nproc-per-node 2 --world-size "$world" --job "$job" --socket "$dir/ckptd.sock" \
    --poll-ms 50 --grace-ms 1000 --master-port $((master_base + 1)) --warm "$warm" \
    "${rendezvous[@]}" -- \
    "${trainer_cmd[@]}" "${trainer_pace[@]}"
  launcher_pgid[$id]=$started
}
start_node a
start_node b
start_node c --spare
echo "   ckptd a, b (capacity 2) and spare c registered"
run_t0=$(now)
for id in a b c; do start_launcher "$id"; done
echo "   ckptrun started on a, b and c ($warm warm process(es) each)"
logs=("$work"/node-{a,b,c}/ckptrun.log)

events_table() { ctl events 2>/dev/null || true; }

step_at_least() { (($(max_step "${logs[@]}") >= $1)); }

# Each kill lands 3 steps past a save, so the steps it costs are visible.
# --- failure 1: one trainer of node a --------------------------------------
kill1_at=$((steps / 4 / ckpt_every * ckpt_every + 3))
wait_for 120 step_at_least 1 || fail "training never started"
# Found before the kill is due: scanning /proc takes a while on a busy machine.
ckptrun_a=$(children_named ckptrun "${launcher_pgid[a]}")
# A trainer with a rank: not a warm process (WARM), which has none yet.
victim="" victim_rank=""
for p in $(children_named "$trainer" "$ckptrun_a"); do
  victim_rank=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | sed -n 's/^RANK=//p' || true)
  [[ -z $victim_rank ]] || { victim=$p; break; }
done
[[ -n $victim ]] || fail "no $trainer with a rank running under ckptrun of node a"
gen_before=$(job_field generation)
wait_for 120 step_at_least "$kill1_at" || fail "training never reached step $kill1_at"
kill1_t=$(now)
kill -KILL "$victim"
kill1_step=$(max_step "${logs[@]}")
echo
echo "-- failure 1: SIGKILL $trainer pid $victim (rank $victim_rank, node a) at step $kill1_step" \
  "(last good step $(job_field last_good_step))"
plan_acked_after() {
  local g=$1
  [[ $(job_field generation) -gt $g && $(job_field plan_state) == '"PLAN_ACKNOWLEDGED"' ]]
}
wait_for 60 plan_acked_after "$gen_before" || fail "no acknowledged recovery plan after failure 1"
gen1=$(job_field generation)
restore1=$(job_field restore_step)
echo "   generation $gen_before -> $gen1: every rank restores step $restore1"

# --- failure 2: the whole of node b ----------------------------------------
kill2_at=$((steps / 2 / ckpt_every * ckpt_every + 3))
wait_for 120 step_at_least "$kill2_at" || fail "training never reached step $kill2_at after failure 1"
gen_before=$(job_field generation)
kill2_t=$(now)
{
  kill -KILL -- "-${launcher_pgid[b]}"
  kill -KILL "${daemon_pid[b]}"
  wait "${launcher_pgid[b]}" "${daemon_pid[b]}" || true
} 2>/dev/null # reaped quietly, with no "Killed" report
rm -f /dev/shm/"$shm_tag-b"*
kill2_step=$(max_step "${logs[@]}")
echo
echo "-- failure 2: SIGKILL node b (ckptrun's process group + ckptd, /dev/shm arenas removed)" \
  "at step $kill2_step (last good step $(job_field last_good_step))"
wait_for 60 plan_acked_after "$gen_before" || fail "no acknowledged recovery plan after failure 2"
gen2=$(job_field generation)
restore2=$(job_field restore_step)
placement=$(cluster_json | grep -o '"rank_node":\[[^]]*\]' | awk 'NR == 1')
echo "   generation $gen_before -> $gen2: every rank restores step $restore2; $placement"

# --- the job finishes ------------------------------------------------------
for id in a c; do
  wait_for 180 exited "${launcher_pgid[$id]}" ||
    fail "ckptrun of node $id still running"
  rc=0
  wait "${launcher_pgid[$id]}" || rc=$?
  ((rc == 0)) || fail "ckptrun of node $id exited $rc: $(tail -n 5 "$work/node-$id/ckptrun.log")"
done
run_t1=$(now)
run_s=$(awk -v a="$run_t0" -v b="$run_t1" 'BEGIN { printf "%.1f", b - a }')
echo
echo "   ckptrun of a and c exited 0; disturbed run took $run_s s"

# ---------------------------------------------------------------------------
echo
echo "== 3. check: every rank's final params_digest against the reference"
mismatch=0
for ((r = 0; r < world; ++r)); do
  line=$(cat "${logs[@]}" | grep -h " done rank=$r step " | tail -n1 || true)
  digest=${line##*params_digest=}
  last=$(sed -n 's/.* done rank=[0-9]* step \([0-9]*\) .*/\1/p' <<<"$line")
  if [[ -z $line ]]; then
    echo "   rank $r: no final line" && mismatch=1
  elif [[ $digest != "$ref_digest" || $last != "$steps" ]]; then
    echo "   rank $r: step $last params_digest=$digest  MISMATCH (reference $ref_digest)" && mismatch=1
  else
    echo "   rank $r: step $last params_digest=$digest  ok"
  fi
done
((mismatch == 0)) || fail "final params differ from the undisturbed reference"

# ---------------------------------------------------------------------------
# Recovery figures. Events carry the coordinator's monotonic clock; trainer
# lines carry wall-clock stamps: each is only compared with its own kind.
events=$(events_table)
# The coordinator's view of one failure: its events from the first one
# after seq $1 up to the PLAN_ACKED of generation $2, in ms from the first.
# Prints them, then "SEQ MS" of that PLAN_ACKED and the span, last.
timeline() {
  awk -v from="$1" -v gen="$2" '
    $1 ~ /^[0-9]+$/ && $1 > from && $5 ~ /^(FAILURE_DETECTED|PLAN_MADE|PLAN_WAITING|PLAN_ACKED)$/ {
      if (t0 == "") t0 = $2
      d = $0
      for (i = 0; i < 5; i++) sub(/^ *[^ ]+ +/, "", d)
      printf "       +%5d ms  %-16s %s%s\n", $2 - t0, $5, ($4 == "-" ? "" : "node " $4 ": "), d
      if ($5 == "PLAN_ACKED" && index(d, "generation " gen ":") == 1) { print "END", $1, $2 - t0; exit }
    }' <<<"$events"
}
# Wall-clock stamp of the first trainer line "step N" (N = restore + 1)
# logged after time $1.
resumed_at() {
  cat "${logs[@]}" | awk -v t="$1" -v s="$(($2 + 1))" \
    '$1 > t && $2 == "step" && $3 == s { print $1 }' | sort -n | awk 'NR == 1'
}
# Survivors of a failure that kept their process (in-process restart):
# distinct ranks ckptrun kept for generation $1 (its own log line, the
# same for ckpt-worker and a PyTorch script), of $2 survivors. A rank whose
# process ckptrun had not yet reaped when the plan came is "kept" first,
# then started anew (or placed in a warm process): not a survivor.
kept_of() {
  local kept
  kept=$(cat "${logs[@]}" | awk -v g="generation $1:" '
    index($0, g) == 0 { next }
    { line = substr($0, index($0, g) + length(g)) }
    line ~ /^ rank [0-9]+ keeps its process/ { split(line, w, " "); kept[w[2]] = 1 }
    line ~ /^ rank [0-9]+ placed in a warm process/ { split(line, w, " "); anew[w[2]] = 1 }
    line ~ /^ start ranks / { split(line, w, " "); n = split(w[3], r, ","); for (i = 1; i <= n; ++i) anew[r[i]] = 1 }
    END { c = 0; for (k in kept) if (!(k in anew)) ++c; print c }')
  echo "$kept of $2"
}
# Wall-clock stamp of the $3-th trainer line "step N" (N = restore + 1)
# after time $1: with $3 the world size, every rank (the ones started anew
# too) has trained its first step.
all_resumed_at() {
  cat "${logs[@]}" | awk -v t="$1" -v s="$(($2 + 1))" \
    '$1 > t && $2 == "step" && $3 == s { print $1 }' | sort -n | awk -v n="$3" 'NR == n'
}
# Ranks of generation $1 placed in a warm process (ckptrun --warm).
warm_of() {
  cat "${logs[@]}" | { grep -o "generation $1: rank [0-9]* placed in a warm process" || true; } |
    awk '{ print $4 }' | sort -u | wc -l
}
# With $CKPT_RESILIENT_PHASES set (the phase stamps of PyTorch trainers,
# ckpt/torch/_resilient.py), the phases of a restart between times $1 and
# $2, in ms after $1 (the kill): over the ranks that stamped each, the
# first and the last; then the trainers' "restored step" and first step
# (step $3 + 1) lines, by their log stamps; ordered by the first.
phase_table() {
  cat "${logs[@]}" | awk -v t0="$1" -v t1="$2" -v s="$(($3 + 1))" '
    function put(name, w) {
      if (w <= t0 || w >= t1) return
      if (!(name in lo)) { order[n++] = name; lo[name] = w; hi[name] = w; c[name] = 0 }
      if (w < lo[name]) lo[name] = w
      if (w > hi[name]) hi[name] = w
      c[name]++
    }
    ($2 == "ckpt.resilient:" || $2 == "train_gpt:") && $3 == "phase" { w = $NF; sub(/^wall=/, "", w); put($4, w + 0) }
    $2 == "restored" && $3 == "step" { put("restored_log", $1 + 0) }
    $2 == "step" && $3 == s { put("first_step_log", $1 + 0) }
    END {
      for (i = 0; i < n; i++) {
        k = order[i]
        printf "       %-22s %5d .. %5d ms (%d)\n", k, (lo[k] - t0) * 1000, (hi[k] - t0) * 1000, c[k]
      }
    }' | sort -k2,2n -s
}
acked_seq=0
report_failure() {
  local n=$1 what=$2 kill_t=$3 kill_step=$4 restore=$5 gen=$6 survivors=$7
  local lines resumed
  printf "   failure %d: %s\n" "$n" "$what"
  printf "     step reached at the kill %d, restored step %d: steps lost %d (trained again)\n" \
    "$kill_step" "$restore" $((kill_step - restore))
  lines=$(timeline "$acked_seq" "$gen")
  if [[ $lines == *END* ]]; then
    echo "     coordinator events (its clock, from the first detection):"
    grep -v '^END' <<<"$lines"
    read -r _ acked_seq span <<<"$(grep '^END' <<<"$lines")"
    printf "     first detection -> recovery plan acknowledged by every node: %d ms\n" "$span"
  else
    echo "     coordinator events: no PLAN_ACKED of generation $gen found"
  fi
  resumed=$(resumed_at "$kill_t" "$restore")
  [[ -z $resumed ]] || printf "     kill -> first training step after the restore (step %d): %d ms; survivors kept their process: %s\n" \
    $((restore + 1)) "$(ms_between "$kill_t" "$resumed")" "$(kept_of "$gen" "$survivors")"
  # The figure ends at the step's line: the step's compute and
  # collectives, not the pause after it (which the plan cuts short).
  ((pace_ms == 0)) || printf "     (the end of that step, before its %d ms pause; one step of this run: %.1f ms, %.1f ms of it not the pause)\n" \
    "$pace_ms" "$plain_ms" "$(awk -v a="$plain_ms" -v p="$pace_ms" 'BEGIN { print a - p }')"
  resumed=$(all_resumed_at "$kill_t" "$restore" "$world")
  [[ -z $resumed ]] || printf "     kill -> every rank's first step (those started anew too): %d ms; ranks placed in a warm process: %d of %d\n" \
    "$(ms_between "$kill_t" "$resumed")" "$(warm_of "$gen")" $((world - survivors))
}

# Step time (wall clock, node a's log) on steps that wait for a save vs
# the others: ckpt-worker does not print its save stall, so this is the
# visible cost of a save. A save is issued after step k*E (which first
# waits until the daemon took the previous save) and its copy must finish
# before step k*E+1's optimizer update.
save_cost() {
  awk -v e="$ckpt_every" '
    / start ranks | restored step / { prev_s = "" }  # no interval across a restart
    $2 == "step" && $4 == "loss" {
      if (seen[$3]++) next  # the other rank of the node, or a step run again
      if (prev_s != "" && $3 == prev_s + 1) {
        d = ($1 - prev_t) * 1000
        if ($3 % e == 0 || $3 % e == 1) save[ns++] = d; else plain[np++] = d
      }
      prev_s = $3; prev_t = $1
    }
    function median(a, n,   i, j, t) {
      for (i = 1; i < n; i++) for (j = i; j > 0 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n ? a[int(n / 2)] : 0
    }
    END { printf "%.1f %.1f %d %d\n", median(save, ns), median(plain, np), ns, np }' "$work/node-a/ckptrun.log"
}

echo
echo "== report"
printf "   reference: %d steps in %s s (%.1f steps/s); disturbed run: %s s\n" "$steps" "$ref_s" \
  "$(awk -v s="$steps" -v t="$ref_s" 'BEGIN { print s / t }')" "$run_s"
read -r save_ms plain_ms n_save n_plain <<<"$(save_cost)"
report_failure 1 "$trainer rank $victim_rank of node a SIGKILLed" "$kill1_t" "$kill1_step" "$restore1" "$gen1" $((world - 1))
if [[ -n ${CKPT_RESILIENT_PHASES:-} ]]; then
  echo "     phases after the kill (first .. last rank, ms; ranks stamped):"
  phase_table "$kill1_t" "$kill2_t" "$restore1"
fi
report_failure 2 "node b SIGKILLed, spare c takes its ranks" "$kill2_t" "$kill2_step" "$restore2" "$gen2" $((world - 2))
shard_bytes=$(sed -n 's/.*STEP_DURABLE.*step \([0-9]*\): \([0-9]*\) bytes on \([0-9]*\) ranks.*/\2 \3/p' <<<"$events" | tail -n1)
printf "   saves: every %d steps, %s bytes per step over %s ranks (SaveAsync; the trainer prints no stall figure)\n" \
  "$ckpt_every" "${shard_bytes% *}" "${shard_bytes#* }"
printf "     median step time, steps around a save %.1f ms (%d) vs other steps %.1f ms (%d): %+.1f ms per save\n     (within noise at this checkpoint size)\n" \
  "$save_ms" "$n_save" "$plain_ms" "$n_plain" "$(awk -v a="$save_ms" -v b="$plain_ms" 'BEGIN { print a - b }')"
prefetch=$(grep -h 'prefetched' "$work/node-c/ckptd.log" | sed 's/.*ckptd info: //' | awk 'NR <= 2' || true)
[[ -z $prefetch ]] || sed 's/^/   spare c: /' <<<"$prefetch"
echo
echo "demo: OK: every rank ended bit-identical to the undisturbed run ($ref_digest)"
