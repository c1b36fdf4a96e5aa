// Dropping shards and the deletes owed to storage. See shard_drops.h.
#include "daemon/state/shard_drops.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "storage/keys.h"
#include "util/status.h"

namespace ckpt::daemon {

ShardDrops::ShardDrops(JobTable* table, Catalog* catalog, CatalogWriter* writer,
                       Persister* persister, Uploader* uploader,
                       std::string node_id)
    : table_(table),
      catalog_(catalog),
      writer_(writer),
      persister_(persister),
      uploader_(uploader),
      node_id_(std::move(node_id)) {}

std::vector<DropPlan> ShardDrops::PlanSuperseded(const Job& job, uint64_t step,
                                                 uint32_t rank,
                                                 CatalogEdit& edit) const {
  std::vector<DropPlan> drops;
  for (const auto& [n, st] : job.steps)
    if (n >= step && st.shards.count(rank))
      drops.push_back(Plan(job, n, rank, n != step, edit));
  return drops;
}

std::vector<uint64_t> ShardDrops::Newer(const Job& job, uint64_t step,
                                        uint32_t rank) {
  std::vector<uint64_t> newer;
  for (auto it = job.steps.upper_bound(step); it != job.steps.end(); ++it)
    if (it->second.shards.count(rank)) newer.push_back(it->first);
  return newer;
}

std::vector<std::string> ShardDrops::Basis(const Job& job,
                                           const std::vector<DropPlan>& drops) {
  std::vector<std::string> basis;
  for (const DropPlan& d : drops) {
    auto step = job.steps.find(d.step);
    if (step == job.steps.end()) {
      basis.push_back("gone");
      continue;
    }
    auto sh = step->second.shards.find(d.rank);
    if (sh == step->second.shards.end()) {
      basis.push_back("gone");
      continue;
    }
    const Shard& s = sh->second;
    basis.push_back(
        absl::StrCat(s.gen, "/", static_cast<int>(s.phase), "/", s.uploaded,
                     s.local_gone, step->second.manifest,
                     step->second.object_manifest, step->second.shards.size()));
  }
  return basis;
}

void ShardDrops::Drop(Job& job, uint64_t step_no, uint32_t rank,
                      bool delete_file) {
  table_->AssertHeld();
  CatalogEdit edit;
  DropPlan plan = Plan(job, step_no, rank, delete_file, edit);
  const uint64_t ticket = writer_->Enqueue(std::move(edit), /*sync=*/true);
  Apply(job, std::move(plan), ticket);
}

DropPlan ShardDrops::Plan(const Job& job, uint64_t step_no, uint32_t rank,
                          bool delete_file, CatalogEdit& edit) const {
  DropPlan plan{step_no, rank, {}, std::nullopt};
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return plan;
  auto sh = step->second.shards.find(rank);
  if (sh == step->second.shards.end()) return plan;
  const std::string& name = job.rec.job();
  auto intent = [&](catv1::DeleteIntent::Tier tier,
                    const std::vector<std::string>& keys, bool prefix) {
    catv1::DeleteIntent d;
    d.set_tier(tier);
    for (const std::string& k : keys) d.add_keys(k);
    d.set_prefix(prefix);
    d.set_job(name);
    d.set_step(step_no);
    const uint64_t id = catalog_->NewIntentId();
    edit.PutDeleteIntent(id, d);
    return id;
  };
  auto local = [&](std::string key, bool prefix) {
    const uint64_t id = intent(catv1::DeleteIntent::LOCAL, {key}, prefix);
    plan.local.push_back({std::move(key), prefix, id});
  };
  const bool was_durable =
      sh->second.phase == ShardPhase::kDurable && !sh->second.local_gone;
  const bool delete_object = delete_file && sh->second.uploaded;
  if (uploader_ != nullptr && (step->second.object_manifest || delete_object)) {
    // One ordered task: the object manifest goes before the shard. The
    // step is no longer whole, so its object manifest goes even when the
    // shard's key is about to be written again (a re-save of the step).
    UploadTask del{UploadTask::kDelete, name, step_no};
    if (step->second.object_manifest)
      del.keys.push_back(storage::ManifestKey(name, step_no, node_id_));
    if (delete_object) del.keys.push_back(sh->second.rec.path());
    del.intent = intent(catv1::DeleteIntent::OBJECT, del.keys, false);
    plan.object = std::move(del);
  }
  // The intents go before the record deletes that made them due.
  // The step is no longer whole: its manifest goes first.
  if (step->second.manifest)
    local(storage::ManifestKey(name, step_no, node_id_), false);
  if (delete_file && was_durable)
    local(storage::ShardKey(name, step_no, rank, node_id_), false);
  // A shared root holds other nodes' files under the same prefix.
  if (step->second.shards.size() == 1 && delete_file && node_id_.empty())
    local(storage::StepPrefix(name, step_no), true);
  edit.DeleteShard(name, step_no, rank);
  return plan;
}

void ShardDrops::Apply(Job& job, DropPlan plan, uint64_t ticket) {
  table_->AssertHeld();
  if (!table_->EraseShard(job, plan.step, plan.rank)) return;
  if (plan.object) {
    plan.object->ticket = ticket;
    uploader_->Push(std::move(*plan.object));
  }
  for (LocalDelete& d : plan.local) {
    d.ticket = ticket;
    PushLocal(std::move(d));
  }
}

void ShardDrops::QueueLocalDelete(const std::string& job, uint64_t step,
                                  std::string key, bool prefix) {
  table_->AssertHeld();
  catv1::DeleteIntent intent;
  intent.set_tier(catv1::DeleteIntent::LOCAL);
  intent.add_keys(key);
  intent.set_prefix(prefix);
  intent.set_job(job);
  intent.set_step(step);
  const uint64_t id = catalog_->NewIntentId();
  CatalogEdit edit;
  edit.PutDeleteIntent(id, intent);
  const uint64_t ticket = writer_->Enqueue(std::move(edit), /*sync=*/false);
  PushLocal({std::move(key), prefix, id, ticket});
}

void ShardDrops::PushLocal(LocalDelete del) {
  if (table_->leases().HoldsFile(del.key, del.prefix)) {
    // A FILE restore reads it: its CloseRestore (or its holder's exit)
    // queues the delete. The intent is recorded, so a restart does it too.
    deferred_.push_back(std::move(del));
    return;
  }
  persister_->QueueDelete(std::move(del.key), del.prefix, del.intent,
                          del.ticket);
}

void ShardDrops::QueueObjectDelete(UploadTask del) {
  table_->AssertHeld();
  if (del.keys.empty()) return;
  catv1::DeleteIntent intent;
  intent.set_tier(catv1::DeleteIntent::OBJECT);
  for (const std::string& k : del.keys) intent.add_keys(k);
  intent.set_job(del.job);
  intent.set_step(del.step);
  del.intent = catalog_->NewIntentId();
  CatalogEdit edit;
  edit.PutDeleteIntent(del.intent, intent);
  del.ticket = writer_->Enqueue(std::move(edit), /*sync=*/false);
  uploader_->Push(std::move(del));
}

absl::Status ShardDrops::Recover() {
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

void ShardDrops::ReleaseDeferred() {
  table_->AssertHeld();
  std::vector<LocalDelete> deferred;
  deferred.swap(deferred_);
  for (LocalDelete& d : deferred) PushLocal(std::move(d));
}

}  // namespace ckpt::daemon
