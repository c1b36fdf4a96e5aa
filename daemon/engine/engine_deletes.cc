// Delete (the RPC): drops the steps' shards (shard_drops.h records each
// delete as an intent and queues it), and forgets a job left without steps.
// It answers once its records are written and the job's arenas are gone.
// See engine.h.
#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/engine.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::StatusOr<v1::DeleteResponse> Engine::Delete(
    const PeerCreds& peer, const v1::DeleteRequest& req) {
  Section lock(&node_);
  CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
  std::vector<uint64_t> steps;
  if (req.all_steps()) {
    for (const auto& [n, step] : job->steps) steps.push_back(n);
  } else {
    if (!job->steps.count(req.step()))
      return absl::NotFoundError(
          absl::StrCat("step: job '", req.job(), "' has no step ", req.step()));
    steps.push_back(req.step());
  }
  for (uint64_t n : steps) {
    if (node_.object != nullptr) node_.QueueObjectDelete(*job, n);
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job->steps[n].shards) ranks.push_back(r);
    // The files go through the persister's queue (recorded as intents,
    // held back while a FILE restore reads one), never under the lock.
    for (uint32_t r : ranks) node_.DropShard(*job, n, r, /*delete_file=*/true);
  }
  if (req.all_steps()) {
    // Nothing left: the job's record and arenas go once nothing uses them;
    // a later Register creates the job again. Its life here ends now, even
    // when a persist or lease keeps the record a while and a Register
    // takes it up again: holders of its replicas drop the deleted life's
    // copies once a copy of the new one comes.
    job->forget_when_idle = true;
    job->rec.set_life_ns(NewJobLife());
    if (job->recorded) {
      CatalogEdit edit;
      edit.PutJob(job->rec);
      node_.QueueEdit(std::move(edit), /*sync=*/true);
    }
    node_.MaybeForgetJob(req.job());
  }
  v1::DeleteResponse resp;
  resp.set_deleted_steps(static_cast<uint32_t>(steps.size()));
  // Deleted once the RPC answers: its records are written and a forgotten
  // job's arenas unlinked (outside the lock).
  lock.Unlock();
  node_.writer->Flush();
  node_.arena_drops->Flush();
  return resp;
}

}  // namespace ckpt::daemon
