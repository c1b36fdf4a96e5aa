// Effects: what a transition of the job table asks of its executor
// (NodeState) instead of doing it itself, as raft's Ready hands out messages
// and entries: the catalog edit that records the change, the tasks for
// the persistence pipeline's queues, the reports to the coordinator, the
// deletes owed to storage, the decisions the executor takes next under
// the same lock (retention, forgetting an idle job) and whom to wake.
//
// The executor queues the edit (and the deletes' intents, and the
// reports) in the transition's critical section, so that they keep the
// order of the changes; it pushes the tasks, delivers the reports and
// wakes the waiters once the lock is released (NodeState::Apply,
// NodeState::Perform). Plain data.
#ifndef CKPT_DAEMON_STATE_EFFECTS_H_
#define CKPT_DAEMON_STATE_EFFECTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/core/catalog.h"
#include "daemon/core/engine_options.h"
#include "daemon/pipeline/persister.h"
#include "daemon/pipeline/uploader.h"

namespace ckpt::daemon {

// A file written for a shard that went meanwhile: it must not outlive it
// (an object's is an UploadTask of kind kDelete).
struct OwedDelete {
  std::string job;
  uint64_t step = 0;
  std::string key;
};

struct Effects {
  CatalogEdit edit;   // queued under the lock, in the order of the changes
  bool sync = false;  // the edit's CatalogWriter sync
  std::vector<PersistTask> persist;  // pushed with the lock released
  std::vector<UploadTask> upload;    // likewise (an object tier only)
  std::vector<ShardReport> reports;  // delivered, in order, after unlocking
  std::vector<OwedDelete> deletes;   // intents recorded under the lock
  std::vector<UploadTask> object_deletes;  // likewise, in the object tier
  // Decisions the executor takes under the same lock after the edit:
  // retention of the job runs again (a step can never be whole now), or
  // the job goes if Delete marked it and nothing uses it any more.
  bool retention = false;
  bool forget_job = false;
  // Waiters to wake (JobTable::Waiter) once the lock is released.
  bool wake_slots = false;
  bool wake_durable = false;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_STATE_EFFECTS_H_
