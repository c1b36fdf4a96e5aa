// The fallback ladder: a client found a copy of a shard failing
// verification (CloseRestore with bad_copy). The copy is marked bad, the
// next OpenRestore serves the next copy of the same step (memory → file →
// object), and with none left the shard fails and Latest offers the
// previous good step; each step down is a FALLBACK report. See engine.h.
#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status Engine::CloseRestore(const PeerCreds& peer,
                                  const v1::CloseRestoreRequest& req) {
  std::unique_lock<std::mutex> lock(table_.mu());
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
  if (req.bad_copy().size() > 4096)
    return absl::InvalidArgumentError(absl::StrCat(
        "bad_copy: ", req.bad_copy().size(), " bytes, at most 4096"));
  if (req.lease() == 0 && !req.bad_copy().empty()) {
    // A FILE restore: the shard's stored copy is bad.
    Shard* shard = table_.FindShard(req.job(), req.step(), req.rank());
    if (shard == nullptr)
      return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                              "' has no step ", req.step(),
                                              " for rank ", req.rank()));
    if (shard->phase == ShardPhase::kDurable && !shard->local_gone)
      MarkBadCopyLocked(*job, *shard, ShardCopy::kFile, req.bad_copy());
    lock.unlock();
    writer_->Flush();  // a failed shard's record, written before we answer
    return absl::OkStatus();
  }
  const Lease* lease = table_.leases().FindFor(req.lease(), req.job(),
                                               req.rank(), /*write=*/false);
  if (lease == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no open restore ",
                                            req.lease(), " of job '", req.job(),
                                            "' rank ", req.rank()));
  if (!req.bad_copy().empty()) {
    Shard* shard = table_.FindShard(req.job(), lease->step, req.rank());
    if (shard != nullptr && !lease->file_key.empty()) {
      // A FILE restore: the stored copy it read is bad (if still that one).
      if (shard->phase == ShardPhase::kDurable && !shard->local_gone &&
          shard->rec.path() == lease->file_key)
        MarkBadCopyLocked(*job, *shard, ShardCopy::kFile, req.bad_copy());
    } else if (shard != nullptr &&
               shard->slot == static_cast<int>(lease->slot)) {
      MarkBadCopyLocked(*job, *shard, shard->slot_copy, req.bad_copy());
    }
  }
  ReleaseLeaseLocked(req.lease());
  if (req.bad_copy().empty()) return absl::OkStatus();
  lock.unlock();
  writer_->Flush();  // a failed shard's record, written before we answer
  return absl::OkStatus();
}

void Engine::MarkBadCopyLocked(Job& job, Shard& shard, ShardCopy copy,
                               const std::string& error) {
  const std::string what =
      absl::StrCat("job ", job.rec.job(), " step ", shard.rec.step(), " rank ",
                   shard.rec.rank());
  metrics_->Failure(metric::kRestoreChecksum);
  JobTable::DropImage(job, shard);  // its last reader frees the slot
  FallbackReport fallback;
  fallback.job = job.rec.job();
  fallback.step = shard.rec.step();
  fallback.rank = shard.rec.rank();
  fallback.copy = copy == ShardCopy::kMemory ? "memory"
                  : copy == ShardCopy::kFile ? "file"
                                             : "object";
  fallback.reason = absl::StrCat("failed verification: ", error);
  const bool durable = shard.phase == ShardPhase::kDurable;
  const bool in_object_tier = object_ != nullptr && shard.uploaded;
  if (copy == ShardCopy::kMemory && durable) {
    fallback.next_copy = shard.local_gone ? "object" : "file";
    LogWarning(absl::StrCat("FALLBACK: ", what,
                            ": the copy in memory failed verification (", error,
                            "); restores read the ", fallback.next_copy,
                            " copy of ", shard.rec.path(), " next"));
    if (options_.on_fallback) options_.on_fallback(fallback);
    return;
  }
  if (copy == ShardCopy::kFile && durable && in_object_tier &&
      !shard.local_gone) {
    // The local file goes as local retention would drop it; the object
    // tier's copy, verified as it is loaded, serves the step.
    fallback.next_copy = "object";
    LogWarning(absl::StrCat("FALLBACK: ", what, ": the stored copy ",
                            shard.rec.path(), " failed verification (", error,
                            "); it is deleted and restores read the object "
                            "tier's copy next"));
    if (options_.on_fallback) options_.on_fallback(fallback);
    DropLocalShardLocked(job, shard.rec.step(), shard);
    return;
  }
  if (options_.on_fallback) options_.on_fallback(fallback);
  // No good copy left: the step is no longer restorable here, and Latest
  // offers the previous good step.
  LogWarning(absl::StrCat(
      "FALLBACK: ", what, ": ",
      copy == ShardCopy::kMemory
          ? "the copy in memory"
          : absl::StrCat("the ", fallback.copy, " copy of ", shard.rec.path()),
      " failed verification (", error,
      "); no other copy here, the step is dropped from Latest"));
  FailShardLocked(shard, absl::StrCat("failed verification: ", error));
  auto step = job.steps.find(shard.rec.step());
  if (step != job.steps.end() && step->second.manifest) {
    // The step is not whole any more: its manifest must not count.
    persister_->QueueDelete(NodeManifestKey(job.rec.job(), shard.rec.step()),
                            false);
    step->second.manifest = false;
  }
}

}  // namespace ckpt::daemon
