// Cluster mode: the ranks this node hosts, reports to the coordinator and
// prefetches ordered by it. See engine.h.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "storage/shard_reader.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

void Engine::ReportShard(const Shard& shard, bool durable, bool failed) {
  Outbox(table_.ReportOf(shard, durable, failed));
}

void Engine::FailShard(Shard& shard, const std::string& error) {
  Effects fx = table_.Fail(shard, error);
  Apply(fx);  // an edit and a report: nothing left to perform
}

void Engine::SetHostedRanks(const std::string& job_name,
                            std::vector<uint32_t> ranks,
                            std::optional<uint64_t> keep_from) {
  Section lock(this);
  Hosting now{std::set<uint32_t>(ranks.begin(), ranks.end()), keep_from};
  if (!table_.SetHosting(job_name, std::move(now))) return;
  // Steps may have become complete here (ranks moved away), or deletable.
  Job* job = table_.Find(job_name);
  if (job == nullptr) return;
  for (auto& [n, step] : job->steps) MaybeQueueManifest(*job, n);
  ApplyRetention(*job);
}

absl::Status Engine::Prefetch(const std::string& job_name, uint32_t world_size,
                              uint64_t step, uint32_t rank,
                              const std::string& key,
                              std::optional<uint32_t> owner_uid) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job_name));
  if (world_size == 0 || world_size > options_.max_world_size ||
      rank >= world_size)
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " with rank ", rank, " is not valid"));
  if (!storage::IsShardKeyOf(key, job_name, step, rank))
    return absl::InvalidArgumentError(
        absl::StrCat("shard_key: \"", key, "\" is not the key of job '",
                     job_name, "' step ", step, " rank ", rank));
  // Without a shared directory the shard is in the object tier (the
  // shared root there); a local copy wins when there is one.
  storage::Backend* source = backend_;
  if (object_ != nullptr && !backend_->Stat(key).ok()) source = object_;
  // Read and check the header and index before touching any state.
  CKPT_ASSIGN_OR_RETURN(storage::ShardInfo info,
                        storage::ReadShardInfo(*source, key));
  if (info.job != job_name || info.step != step || info.rank != rank ||
      info.world_size != world_size)
    return absl::DataLossError(absl::StrCat(
        key, ": holds job '", info.job, "' step ", info.step, " rank ",
        info.rank, " of ", info.world_size, ", not the one ordered"));
  // The file's owner is only a guess for an older coordinator's order: an
  // object store has none, and a root-squashed NFS says "nobody".
  uint32_t uid = 0;
  if (owner_uid) {
    uid = *owner_uid;
  } else if (auto object = source->Stat(key);
             object.ok() && object->owner_uid) {
    uid = *object->owner_uid;
  }

  Section lock(this);
  if (draining_) return absl::UnavailableError("ckptd is shutting down");
  // The records are written in order outside the lock; the prefetch fails if
  // they could not be (the shard is then only in memory here).
  std::vector<uint64_t> tickets;
  if (table_.Find(job_name) == nullptr) {
    Job job;
    job.rec.set_job(job_name);
    job.rec.set_world_size(world_size);
    job.rec.set_uid(uid);
    job.rec.set_num_slots(options_.default_num_slots);
    job.rec.set_life_ns(NewJobLife());
    CatalogEdit edit;
    edit.PutJob(job.rec);
    tickets.push_back(QueueEdit(std::move(edit), kMemoryOnly));
    table_.Add(std::move(job));
  }
  Job& job = *table_.Find(job_name);
  job.forget_when_idle = false;
  if (job.rec.world_size() != world_size)
    return absl::FailedPreconditionError(
        absl::StrCat("world_size: job '", job_name, "' has ",
                     job.rec.world_size(), " ranks here, not ", world_size));
  auto existing = job.steps.find(step);
  if (existing != job.steps.end() && existing->second.shards.count(rank)) {
    Shard& have = existing->second.shards[rank];
    if (have.slot >= 0) return absl::OkStatus();  // already in memory
    if (have.phase != ShardPhase::kDurable) DropShard(job, step, rank, false);
  }
  // Newer shards of this rank belong to a timeline the plan abandoned.
  std::vector<uint64_t> newer;
  for (const auto& [n, s] : job.steps)
    if (n > step && s.shards.count(rank)) newer.push_back(n);
  for (uint64_t n : newer) DropShard(job, n, rank, /*delete_file=*/false);

  Step& target = job.steps[step];
  if (!target.shards.count(rank)) {
    Shard shard;
    shard.rec.set_job(job_name);
    shard.rec.set_step(step);
    shard.rec.set_rank(rank);
    shard.rec.set_world_size(world_size);
    shard.Start(ShardPhase::kDurable);  // a prefetched shard starts durable
    shard.rec.set_image_bytes(info.layout.image_bytes);
    shard.rec.set_path(key);
    ToTensorMetas(info, shard.rec.mutable_tensors());
    shard.info = info;
    shard.gen = table_.NextGen();
    if (source == object_) {
      // Only in the object tier: never uploaded again, never read locally.
      shard.uploaded = true;
      shard.local_gone = true;
      shard.rec.set_uploaded(true);
      shard.rec.set_local_gone(true);
    }
    // Not synced (kMemoryOnly): the file is the writer's, synced by it;
    // this record only says that this node holds it in memory.
    CatalogEdit edit;
    edit.PutShard(shard.rec);
    tickets.push_back(QueueEdit(std::move(edit), kMemoryOnly));
    target.shards[rank] = std::move(shard);
  }
  double load_s = 0;
  absl::Status loaded = LoadShard(job_name, step, rank, &load_s).status();
  lock.Unlock();
  for (uint64_t t : tickets) CKPT_RETURN_IF_ERROR(writer_->Wait(t));
  CKPT_RETURN_IF_ERROR(loaded);
  LogInfo(absl::StrCat("prefetched ", key, " (", info.layout.image_bytes,
                       " bytes) in ", load_s, " s"));
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
