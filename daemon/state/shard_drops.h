// ShardDrops: removing a rank's shard of a step from the node, and every
// delete the daemon owes storage (retention, superseded, deleted and
// abandoned shards, and their steps' manifests).
//
// A drop is planned first: the catalog edit that records it (the shard's
// record deleted, each file and object to delete recorded as a
// DeleteIntent, intents before the record deletes that made them due) and
// the deletes to queue, changing nothing; then applied once the caller
// queued the edit to the catalog writer: the job table forgets the shard
// and the deletes are queued (the persister's for the local tier, the
// uploader's for the object tier), each waiting until the edit recording
// its intent is written. A daemon that dies first finds the intents at its
// next start (Recover) and queues them again, ahead of everything else, so
// a step it deleted never stays visible. A local delete of a file that a
// FILE restore reads is held back until that restore's lease ends
// (ReleaseDeferred), its intent recorded already.
//
// Thread-safety: none of its own. Every method but Recover and the plans
// (which read only the job they are given) is called with the job table's
// lock held, and asserts it (JobTable::AssertHeld) (it queues into the
// persister and uploader, whose locks come after it); Recover runs once at
// start, before the pipeline starts.
#ifndef CKPT_DAEMON_STATE_SHARD_DROPS_H_
#define CKPT_DAEMON_STATE_SHARD_DROPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/pipeline/persister.h"
#include "daemon/pipeline/uploader.h"
#include "daemon/state/job_table.h"

namespace ckpt::daemon {

// A local delete and its intent.
struct LocalDelete {
  std::string key;
  bool prefix = false;
  uint64_t intent = 0;  // its DeleteIntent's id (0: none recorded)
  uint64_t ticket = 0;  // the catalog edit recording it (0: written)
};

// A planned drop of (step, rank): the deletes it queues once applied.
struct DropPlan {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<LocalDelete> local;  // in order
  std::optional<UploadTask> object;
};

class ShardDrops {
 public:
  // Every pointer must outlive it; uploader is null without an object
  // tier. node_id names this node's files in cluster mode ("" otherwise).
  ShardDrops(JobTable* table, Catalog* catalog, CatalogWriter* writer,
             Persister* persister, Uploader* uploader, std::string node_id);

  // Plans the drop of `job`'s shard of (step, rank) into `edit`, changing
  // nothing; with delete_file its file (and uploaded object) goes too. The
  // step's manifests go either way: the step is no longer whole.
  DropPlan Plan(const Job& job, uint64_t step, uint32_t rank, bool delete_file,
                CatalogEdit& edit) const;
  // The steps above `step` of which `rank` has a shard: what a save of
  // (step, rank) drops besides step itself (a rewind), ascending.
  static std::vector<uint64_t> Newer(const Job& job, uint64_t step,
                                     uint32_t rank);
  // The drops a save of (step, rank) supersedes: the rank's shards of
  // steps >= step (files kept only for step itself, which is re-written).
  std::vector<DropPlan> PlanSuperseded(const Job& job, uint64_t step,
                                       uint32_t rank, CatalogEdit& edit) const;
  // What the planned drops depend on: equal before and after the edit was
  // written when the state they were planned from did not change.
  static std::vector<std::string> Basis(const Job& job,
                                        const std::vector<DropPlan>& drops);
  // Applies a planned drop whose edit is queued as `ticket` (0: written).
  void Apply(Job& job, DropPlan plan, uint64_t ticket);
  // Plan, record (synced) and apply in one: the shard is gone from memory
  // at once; catalog failures are logged by the writer.
  void Drop(Job& job, uint64_t step, uint32_t rank, bool delete_file);

  // A delete owed to storage outside a drop (a file written for a shard
  // that went meanwhile, a local copy retention let go): recorded as an
  // intent, then queued.
  void QueueLocalDelete(const std::string& job, uint64_t step, std::string key,
                        bool prefix);
  void QueueObjectDelete(UploadTask del);
  // A FILE restore's lease ended: the local deletes it held back go.
  void ReleaseDeferred();
  // At start: queues the deletes whose intents a previous run left.
  [[nodiscard]] absl::Status Recover();

 private:
  void PushLocal(LocalDelete del) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_->mu());

  JobTable* const table_;
  Catalog* const catalog_;
  CatalogWriter* const writer_;
  Persister* const persister_;
  Uploader* const uploader_;
  const std::string node_id_;
  // Local deletes of files that FILE restores still read:
  // queued once no lease holds them.
  std::vector<LocalDelete> deferred_ ABSL_GUARDED_BY(table_->mu());
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_STATE_SHARD_DROPS_H_
