// The records the coordinator keeps in memory for each node and each job
// (coordinator.h): its durable record as of the last change, and the soft
// state beside it (shard reports, replicas, incidents, health re-checks,
// hang watch). Plain structs: the Coordinator owns them and guards them
// with its state mutex (NodeLiveness: see its comment).
#ifndef CKPT_COORDINATOR_COORDINATOR_RECORDS_H_
#define CKPT_COORDINATOR_COORDINATOR_RECORDS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coordinator.pb.h"
#include "coordinator/cordon_policy.h"
#include "coordinator/hang_model.h"
#include "coordinator/suspect_policy.h"

namespace ckpt::coordinator {

// Read by heartbeats under Coordinator::live_mu_ (shared); epoch and
// alive change under its mu_ and live_mu_ (exclusive).
struct NodeLiveness {
  uint64_t epoch = 0;
  bool alive = false;
  std::atomic<int64_t> last_seen_ms{0};
  // False while this epoch's registration waits to be durable: the node
  // cannot heartbeat before it has its epoch, so it is not judged yet.
  std::atomic<bool> answered{true};
  // When a heartbeat the coordinator heard and has not answered yet came
  // (0: none). The agent sends one heartbeat at a time, so it is silent
  // until answered: that silence is the coordinator's, for one timeout at
  // most (WindowStart).
  std::atomic<int64_t> owed_since_ms{0};
};

// Where a node's heartbeat window starts, as of `now`: its last heartbeat
// or answer, no earlier than hearing last recovered (`heard_since`), and
// while a heartbeat waits for its answer, no earlier than now, up to one
// timeout after that heartbeat came.
inline int64_t WindowStart(const NodeLiveness& live, int64_t now,
                           int64_t heard_since, int64_t timeout) {
  int64_t last = std::max(live.last_seen_ms.load(), heard_since);
  const int64_t owed = live.owed_since_ms.load();
  if (owed != 0) last = std::max(last, std::min(now, owed + timeout));
  return last;
}
struct NodeState {
  v1::NodeRecord rec;
  NodeLiveness* live = nullptr;  // owned by Coordinator::live_
  IncidentLog incidents;         // soft: hangs and crashes, for cordoning
  ClaimLog claims;  // soft: unconfirmed bad-copy claims, for the verdict
  // Health re-checks (soft): when its newest report came (registration,
  // a heartbeat's report, or this process's load of the node), and the
  // check it is asked to run (0: none; HeartbeatResponse.run_health_check).
  int64_t health_checked_ms = 0;
  uint64_t health_requested = 0;
  // A figure below the median's ratio is measured again before a verdict:
  // the request that re-measures it (0: none), and whether the report
  // being judged is its answer.
  uint64_t low_figure_recheck = 0;
  bool low_figure_answered = false;
};
struct JobState {
  v1::JobRecord rec;
  std::map<uint64_t, std::map<uint32_t, v1::ShardRecord>> steps;  // soft
  std::map<uint64_t, uint32_t> durable_ranks;  // per step, of `steps`
  // Soft, of `steps`: per step and rank, the layout index blob of the
  // rank's DURABLE report (ShardReport.layout_index), merged at commit.
  std::map<uint64_t, std::map<uint32_t, std::shared_ptr<const std::string>>>
      rank_indexes;
  // Verified replicas (soft): step -> rank -> holder -> its
  // REPLICATED record (node_id and epoch: the holder's). A holder keeps
  // the two newest replicated steps of each rank, and so do these.
  std::map<uint64_t, std::map<uint32_t, std::map<std::string, v1::ShardRecord>>>
      replicas;
  std::map<std::string, std::vector<uint32_t>>
      ranks_by_node;              // of rec.rank_node
  std::set<uint64_t> committing;  // steps whose manifest is being written
  int64_t plan_ordered_ms = 0;    // when the current plan's orders were queued
  // Soft: for each of the newest generations a plan made, when the failure
  // it was planned for was last heard from (the coordinator's clock). A
  // trainer without a generation that started before the current one's
  // runs in an older generation (ShardReport.trainer_age_ms).
  std::map<uint64_t, int64_t> failure_ms;
  // Soft: since when ranks of the job wait for a host (0: none wait); an
  // elastic job shrinks once CoordinatorOptions::spare_wait_ms passed.
  int64_t no_host_since_ms = 0;
  bool spare_wait_over = false;  // that wait ended: planned once for it
  // Trainer exits that wait for the probes of the nodes they suspect
  // (soft; coordinator_probe.cc): the generation they exited in, each
  // exit's node and what it said, and the nodes whose answer is awaited.
  // Any plan of the job covers them (every rank restarts).
  struct HeldExit {
    std::string node_id;
    uint32_t rank = 0;
    std::string cause;  // "trainer of rank R exited with code C ..."
    // It said it lost peers: a symptom, charged to no incident of its own
    // node. The hosts of the peer ranks it named (none named: empty), each
    // charged if it answers the probe (its trainers, not its daemon, went).
    bool peer_lost = false;
    std::vector<std::string> named_hosts;
  };
  uint64_t held_generation = 0;
  std::vector<HeldExit> held_exits;
  std::set<std::string> awaited_probes;
  // Soft: the ranks that exited cleanly in generation clean_exit_gen - 1
  // (0: none). All of them: the job is finished (JobView.job_finished), and
  // a launcher whose own ranks finished first may leave.
  uint64_t clean_exit_gen = 0;
  std::set<uint32_t> clean_exits;
  // rec as of the last durable commit: what heartbeats and watches show,
  // so that they never wait for a disk write.
  v1::JobRecord durable_rec;
  std::map<std::string, std::vector<uint32_t>> durable_ranks_by_node;
  // Hang detection (soft): the generation watched (0: none, a plan is
  // under way), when it started, the ranks' last reports, and the ranks
  // that finished in it (not watched).
  struct HangWatch {
    uint64_t generation = 0;
    int64_t start_ms = 0;
    std::map<uint32_t, RankBeat> beats;
    std::set<uint32_t> finished;
    // Stragglers: the next window's end, consecutive slow windows per
    // rank, and the ranks named.
    int64_t next_window_ms = 0;
    std::map<uint32_t, int> slow_windows;
    std::set<uint32_t> stragglers;
  } watch;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_RECORDS_H_
