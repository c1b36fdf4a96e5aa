#!/bin/sh
# CTest smoke run of recovery_bench at tiny sizes (one round of each path,
# a small worker, one warm and one cold restart round, one resharding
# round): the JSON has every key scripts rely on, the peer path restored the lost ranks from a replica
# and the storage path from storage, and every figure the keys name was
# measured. No timing threshold.
set -eu
dir=$(mktemp -d "${TMPDIR:-/tmp}/recovery-smoke.XXXXXX")
trap 'rm -rf "$dir"' EXIT
# A bad --storage-gbit is refused naming the flag, before anything runs.
if err=$("$1" --storage-gbit 0 --dir "$dir" 2>&1); then
  echo "--storage-gbit 0 was accepted" >&2; exit 1
fi
echo "$err" | grep -q -- "--storage-gbit: Gbit/s in" || { echo "$err" >&2; exit 1; }
if err=$("$1" --storage-gbit 1 --object-url s3://b/p --dir "$dir" 2>&1); then
  echo "--storage-gbit with --object-url was accepted" >&2; exit 1
fi
echo "$err" | grep -q -- "--storage-gbit: caps a directory" || { echo "$err" >&2; exit 1; }
if err=$("$1" --restart --no-restart --dir "$dir" 2>&1); then
  echo "--restart with --no-restart was accepted" >&2; exit 1
fi
echo "$err" | grep -q -- "--restart: not with" || { echo "$err" >&2; exit 1; }
if err=$("$1" --reshard --no-reshard --dir "$dir" 2>&1); then
  echo "--reshard with --no-reshard was accepted" >&2; exit 1
fi
echo "$err" | grep -q -- "--reshard: not with" || { echo "$err" >&2; exit 1; }
[ -z "$(ls -A "$dir")" ] || { echo "a refused run left files in $dir" >&2; exit 1; }
out=$("$1" --bytes-per-rank 4194304 --rounds 1 --worker-dim 64 --worker-steps 3 \
      --dir "$dir" --json)
echo "$out"
for key in bytes_per_rank detect_s plan_s prefetch_s trainer_restart_s restore_s \
           node_recovery_s raw_read_lost_shards_s node_recovery_ratio crash_restore_s \
           crash_process_start_to_restored_s memcpy_rank_state_s crash_restore_ratio \
           crash_all_ranks_restore_s memcpy_all_ranks_s crash_all_ratio restore_step \
           shared_root progress_ns replicas restore_from raw_transfer_s \
           node_recovery_transfer_ratio node_loss_peer_s node_loss_storage_s raw_read_s \
           steps_lost_node_peer steps_lost_node_storage steps_lost_trainer_crash \
           step_s_replication_off step_s_replication_on step_speed_on_vs_off \
           node_loss_peer_ratio node_loss_storage_ratio link_shaped shm_huge_pages \
           storage_gbit storage_throttled inprocess_restart_s inprocess_restart_step_s \
           warm_replacement_s cold_replacement_s peer_detect_s heartbeat_timeout_s \
           plans_per_failure survivors_kept restart_load_1m; do
  echo "$out" | grep -q "\"$key\":" || { echo "missing key $key" >&2; exit 1; }
done
# Measured, not left at zero.
for key in node_loss_peer_s raw_transfer_s node_loss_storage_s raw_read_s \
           step_s_replication_off step_s_replication_on inprocess_restart_s \
           inprocess_restart_step_s warm_replacement_s cold_replacement_s peer_detect_s \
           plans_per_failure; do
  echo "$out" | grep -q "\"$key\":0\.0*[,}]" && { echo "$key was not measured" >&2; exit 1; }
done
echo "$out" | grep -q '"restore_from_peer":"replica"' ||
  { echo "the peer path did not restore from a replica" >&2; exit 1; }
echo "$out" | grep -q '"restore_from_storage":"storage"' ||
  { echo "the storage path did not restore from storage" >&2; exit 1; }
# The resharding round (8 ranks saved, 6 restore, against 8): its own
# object, each figure measured, the bytes equal to the saved ones.
echo "$out" | grep -q '"reshard":{' || { echo "no \"reshard\" object" >&2; exit 1; }
reshard=$(echo "$out" | sed 's/.*"reshard":{//')
for key in reshard_restore_s same_layout_restore_s plan_s disk_reshard_restore_s \
           disk_same_layout_restore_s reshard_over_same disk_reshard_over_same; do
  echo "$reshard" | grep -q "\"$key\": [0-9.]*[1-9]" ||
    { echo "reshard: $key missing or not measured" >&2; exit 1; }
done
echo "$reshard" | grep -q '"saved_ranks": 8, "restored_ranks": 6' ||
  { echo "reshard: not 8 -> 6" >&2; exit 1; }
echo "$reshard" | grep -q '"restore_matches": true' ||
  { echo "reshard: the restored bytes differ" >&2; exit 1; }
