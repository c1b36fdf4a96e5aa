// recovery_bench's summary of one run: the node-loss rounds of both paths
// (peer memory, storage), the trainer crashes, the replication step rounds
// and the link they ran over, reduced to medians and ratios, printed as a
// table or as one JSON object (whose keys scripts rely on: the old ones of
// recovery_bench plus those of both node-loss paths, the replication step,
// the restart rounds and the resharding round's "reshard" object). Pure
// formatting; not thread-safe.
#ifndef CKPT_BENCH_RECOVERY_REPORT_H_
#define CKPT_BENCH_RECOVERY_REPORT_H_

#include <string>
#include <vector>

#include "bench/node_loss_bench.h"
#include "bench/replication_step.h"
#include "bench/reshard_restore_bench.h"
#include "bench/restart_bench.h"

namespace ckpt::bench {

struct RecoveryRun {
  uint64_t bytes_per_rank = 0;
  int rounds = 0;
  bool primary_replicas = false;  // --replicas: the old keys describe peers
  std::string shared_root;        // "directory" or "object store"
  double progress_ns = 0;
  double progress_store_ns = 0;
  int heartbeat_timeout_ms = 2000;
  int port_base = 0;
  double link_gbit = 0;  // asked for (0: the loopback unshaped)
  bool link_shaped = false;
  std::string link_note;    // why it was not shaped, when asked
  double storage_gbit = 0;  // --storage-gbit asked for (0: the disk's speed)
  bool storage_throttled = false;
  std::string storage_note;    // the disk throttled, or why it was not
  std::string shm_huge_pages;  // shm::ShmHugePagesOf("/dev/shm")
  std::vector<NodeLossFigures> peer, storage;  // in the order run
  std::vector<ReplicationStepFigures> step_off, step_on;
  // The restart rounds: ckptrun --warm 1 with a node loss, and --warm 0.
  std::vector<RestartFigures> restart_warm, restart_cold;
  // The resharding round (bench/reshard_restore_bench.h): the job's state
  // saved at 8 ranks, restored at 6 against 8, from each tier.
  bool reshard_measured = false;
  ReshardFigures reshard;
};

// One JSON object on one line.
std::string RecoveryJson(const RecoveryRun& run);
// The human-readable table.
std::string RecoveryText(const RecoveryRun& run);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_RECOVERY_REPORT_H_
