// Delete (the RPC), and the deletes the engine owes storage (retention,
// superseded and deleted shards): each is recorded in the catalog as a
// DeleteIntent (an edit queued to the catalog writer, which the delete waits
// for) in the same log as (and so before) the deletion of the records that made
// it due, and forgotten by the persister or the uploader once done. A daemon
// that dies first (SIGKILL, a machine crash) finds them at its next start and
// queues them again, ahead of everything else, so that a step it deleted never
// stays visible. See engine.h.
#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::StatusOr<v1::DeleteResponse> Engine::Delete(
    const PeerCreds& peer, const v1::DeleteRequest& req) {
  std::unique_lock<std::mutex> lock(table_.mu());
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
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
    if (object_ != nullptr) QueueObjectDeleteLocked(*job, n);
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job->steps[n].shards) ranks.push_back(r);
    // The files go through the persister's queue (recorded as intents,
    // held back while a FILE restore reads one), never under the lock.
    for (uint32_t r : ranks) DropShardLocked(*job, n, r, /*delete_file=*/true);
  }
  if (req.all_steps()) {
    // Nothing left: the job's record and arenas go once nothing uses them;
    // a later Register creates the job again.
    job->forget_when_idle = true;
    MaybeForgetJobLocked(req.job());
  }
  v1::DeleteResponse resp;
  resp.set_deleted_steps(static_cast<uint32_t>(steps.size()));
  // Deleted once the RPC answers: its records are written and a forgotten
  // job's arenas unlinked (outside the lock).
  lock.unlock();
  writer_->Flush();
  drops_->Flush();
  return resp;
}

void Engine::QueueLocalDeleteLocked(const std::string& job, uint64_t step,
                                    std::string key, bool prefix) {
  catv1::DeleteIntent intent;
  intent.set_tier(catv1::DeleteIntent::LOCAL);
  intent.add_keys(key);
  intent.set_prefix(prefix);
  intent.set_job(job);
  intent.set_step(step);
  const uint64_t id = catalog_->NewIntentId();
  CatalogEdit edit;
  edit.PutDeleteIntent(id, intent);
  const uint64_t ticket = RecordLocked(std::move(edit), /*sync=*/false);
  PushLocalDeleteLocked({std::move(key), prefix, id, ticket});
}

void Engine::PushLocalDeleteLocked(LocalDelete del) {
  if (table_.leases().HoldsFile(del.key, del.prefix)) {
    // A FILE restore reads it: its CloseRestore (or its holder's exit)
    // queues the delete. The intent is recorded, so a restart does it too.
    deferred_deletes_.push_back(std::move(del));
    return;
  }
  persister_->QueueDelete(std::move(del.key), del.prefix, del.intent,
                          del.ticket);
}

void Engine::QueueObjectDeleteTaskLocked(UploadTask del) {
  if (del.keys.empty()) return;
  catv1::DeleteIntent intent;
  intent.set_tier(catv1::DeleteIntent::OBJECT);
  for (const std::string& k : del.keys) intent.add_keys(k);
  intent.set_job(del.job);
  intent.set_step(del.step);
  del.intent = catalog_->NewIntentId();
  CatalogEdit edit;
  edit.PutDeleteIntent(del.intent, intent);
  del.ticket = RecordLocked(std::move(edit), /*sync=*/false);
  uploader_->Push(std::move(del));
}

absl::Status Engine::RecoverDeletes() {
  CKPT_ASSIGN_OR_RETURN(auto intents, catalog_->DeleteIntents());
  size_t local = 0, object = 0;
  for (auto& [id, intent] : intents) {
    if (intent.keys_size() == 0) {
      (void)catalog_->ForgetDeleteIntent(id);
      continue;
    }
    if (intent.tier() == catv1::DeleteIntent::LOCAL) {
      persister_->QueueDelete(intent.keys(0), intent.prefix(), id);
      ++local;
    } else if (uploader_ != nullptr) {
      UploadTask del{UploadTask::kDelete, intent.job(), intent.step()};
      del.keys.assign(intent.keys().begin(), intent.keys().end());
      del.intent = id;
      uploader_->Push(std::move(del));
      ++object;
    } else {
      // Kept: a later start with the object tier configured again does it.
      LogWarning(absl::StrCat(
          "delete of ", intent.keys(0),
          " in the object tier: no object tier now; kept for later"));
    }
  }
  if (local + object > 0)
    LogInfo(absl::StrCat("redoing ", local, " local and ", object,
                         " object-tier deletes left from before the restart"));
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
