// The fallback ladder: a client found a copy of a shard failing
// verification (CloseRestore with bad_copy). The daemon checks that copy
// itself first, with the lock released: a client's word alone never drops
// a copy, since a node with faulty memory or a faulty device finds good
// copies bad and would otherwise destroy every copy it touches. A copy
// that verifies is kept and reported as such (FALLBACK with verified_bad
// false). A copy that is bad is marked bad: the next OpenRestore serves
// the next copy of the same step (memory → file → object), and with none
// left the shard fails and Latest offers the previous good step; each step
// down is a FALLBACK report. See restorer.h.
#include <memory>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/restorer.h"
#include "storage/shard_image.h"
#include "storage/shard_reader.h"
#include "util/status.h"

namespace ckpt::daemon {

namespace {

std::string CopyName(ShardCopy copy) {
  return copy == ShardCopy::kMemory ? "memory"
         : copy == ShardCopy::kFile ? "file"
                                    : "object";
}

// A claim that a copy is bad, captured under the lock so that the copy can
// be checked without it. `image` is the slot the client read (a slot
// lease), held by the lease and by `arena` (the mapping stays while the
// check runs); `stored` is the stored copy the slot came from, or the file
// a FILE restore read.
struct BadCopyClaim {
  uint64_t step = 0;
  uint64_t gen = 0;
  std::string key;
  storage::ShardInfo info;
  std::vector<bool> known;
  uint64_t image_bytes = 0;
  std::shared_ptr<shm::Arena> arena;
  const char* image = nullptr;
  int slot = -1;
  // The stored copy: kFile (the local file), kObject (the object tier's),
  // or kMemory for none (a slot the client committed).
  ShardCopy stored = ShardCopy::kMemory;
};

// What the checks found: the slot's image (when the client read one) and
// the stored copy (when the slot is bad and came from one, or when the
// client read the file). OK: verified; DataLoss: bad; other: not checked
// (an I/O error, for one), which counts as not bad.
struct ClaimVerdict {
  std::optional<absl::Status> slot;
  std::optional<absl::Status> stored;
};

// The slot's image holds the recorded shard: header, index and footer, the
// index the catalog recorded, and every tensor's checksum that is known.
absl::Status VerifySlotImage(const BadCopyClaim& c) {
  const std::string what = absl::StrCat(c.key, " in slot ", c.slot);
  CKPT_ASSIGN_OR_RETURN(
      storage::ShardInfo got,
      storage::ValidateImage({c.image, c.image_bytes},
                             {c.info.job, c.info.step, c.info.rank}, what));
  CKPT_RETURN_IF_ERROR(storage::SameIndex(got, c.info, c.known, what));
  return storage::VerifyTensorChecksums(c.image, c.info, what, c.known);
}

// The stored copy holds the recorded shard, every tensor checked: what a
// restore's load of it would find.
absl::Status VerifyStoredCopy(storage::Backend& backend,
                              const BadCopyClaim& c) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                        storage::ShardReader::Open(backend, c.key));
  const storage::ShardInfo& got = reader->info();
  if (got.job != c.info.job || got.step != c.info.step ||
      got.rank != c.info.rank)
    return absl::DataLossError(
        absl::StrCat(c.key, ": holds job ", got.job, " step ", got.step,
                     " rank ", got.rank, ", not the shard recorded"));
  CKPT_RETURN_IF_ERROR(storage::SameIndex(got, c.info, {}, c.key));
  return reader->Verify();
}

bool Bad(const std::optional<absl::Status>& s) {
  return s && (s->code() == absl::StatusCode::kDataLoss ||
               s->code() == absl::StatusCode::kNotFound);
}

}  // namespace

absl::Status Restorer::CloseRestore(const PeerCreds& peer,
                                    const v1::CloseRestoreRequest& req) {
  Section lock(&node_);
  CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
  if (req.bad_copy().size() > 4096)
    return absl::InvalidArgumentError(absl::StrCat(
        "bad_copy: ", req.bad_copy().size(), " bytes, at most 4096"));
  // Lease 0 names no restore: only a FILE restore's claim of a bad copy
  // (a daemon before leases on files handed out none).
  const Lease* lease = nullptr;
  if (req.lease() != 0 || req.bad_copy().empty()) {
    lease = node_.table.leases().FindFor(req.lease(), req.job(), req.rank(),
                                         /*write=*/false);
    if (lease == nullptr)
      return absl::NotFoundError(
          absl::StrCat("lease: no open restore ", req.lease(), " of job '",
                       req.job(), "' rank ", req.rank()));
  }
  if (req.bad_copy().empty()) {
    node_.ReleaseLease(req.lease());
    return absl::OkStatus();
  }
  const uint64_t step = lease != nullptr ? lease->step : req.step();
  Shard* shard = node_.table.FindShard(req.job(), step, req.rank());
  if (shard == nullptr && lease == nullptr)
    return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                            "' has no step ", step,
                                            " for rank ", req.rank()));
  // What the client read, if it is still this shard's copy: a FILE
  // restore's file (with no lease, the step's current file: the only one
  // this name can mean, checked before anything is done to it), or the
  // slot its lease holds.
  std::optional<BadCopyClaim> claim;
  if (shard != nullptr) {
    BadCopyClaim c;
    c.step = step;
    c.gen = shard->gen;
    c.key = shard->rec.path();
    c.info = shard->info;
    c.known = KnownChecksums(shard->rec.tensors());
    c.image_bytes = shard->rec.image_bytes();
    const bool file_read = lease == nullptr || !lease->file_key.empty();
    if (file_read) {
      if (shard->phase == ShardPhase::kDurable && !shard->local_gone &&
          (lease == nullptr || shard->rec.path() == lease->file_key)) {
        c.stored = ShardCopy::kFile;
        claim = std::move(c);
      }
    } else if (shard->slot >= 0 &&
               shard->slot == static_cast<int>(lease->slot)) {
      auto rank = job->ranks.find(req.rank());
      if (rank != job->ranks.end() && rank->second.arena) {
        c.arena = rank->second.arena;
        c.slot = shard->slot;
        c.image = c.arena->slot_data(shard->slot);
        // A local file that retention dropped since the load is no copy
        // to check (nor to drop): only the slot is.
        c.stored = shard->slot_copy == ShardCopy::kFile && shard->local_gone
                       ? ShardCopy::kMemory
                       : shard->slot_copy;
        claim = std::move(c);
      }
    }
  }
  if (!claim) {
    if (lease != nullptr) node_.ReleaseLease(req.lease());
    return absl::OkStatus();
  }
  // The checks read the copy (disk, object store, a pass over the slot):
  // the lock is released, and the lease keeps the slot and the file.
  lock.Unlock();
  ClaimVerdict verdict;
  if (claim->image != nullptr) verdict.slot = VerifySlotImage(*claim);
  const bool check_stored = claim->image == nullptr || Bad(verdict.slot);
  if (check_stored && claim->stored == ShardCopy::kFile)
    verdict.stored = VerifyStoredCopy(*node_.backend, *claim);
  else if (check_stored && claim->stored == ShardCopy::kObject &&
           node_.object != nullptr)
    verdict.stored = VerifyStoredCopy(*node_.object, *claim);
  lock.Relock();
  job = node_.table.Find(req.job());
  shard = node_.table.FindShard(req.job(), claim->step, req.rank());
  // The verdict is about the copy read: a shard replaced, a slot let go or
  // a file dropped meanwhile is not what was checked.
  bool same = job != nullptr && shard != nullptr && shard->gen == claim->gen;
  if (same && claim->image != nullptr)
    same = shard->slot == claim->slot &&
           node_.table.leases().FindFor(req.lease(), req.job(), req.rank(),
                                        /*write=*/false) != nullptr;
  if (same && claim->image == nullptr)
    same = shard->phase == ShardPhase::kDurable && !shard->local_gone;
  if (same && claim->stored == ShardCopy::kFile && shard->local_gone)
    verdict.stored.reset();  // dropped meanwhile: nothing left to mark
  if (same) {
    if (Bad(verdict.stored)) {
      MarkBadCopy(
          *job, *shard, claim->stored,
          absl::StrCat(req.bad_copy(), "; ", verdict.stored->message()));
    } else if (Bad(verdict.slot)) {
      // Only the slot's image is bad: the next restore reads the stored
      // copy it came from (or, committed there, none is left).
      MarkBadCopy(*job, *shard, ShardCopy::kMemory,
                  absl::StrCat(req.bad_copy(), "; ", verdict.slot->message()));
    } else {
      const absl::Status& checked =
          verdict.stored ? *verdict.stored : *verdict.slot;
      ReportUnconfirmed(
          *job, *shard,
          claim->image != nullptr ? ShardCopy::kMemory : ShardCopy::kFile,
          req.bad_copy(), checked);
    }
  }
  if (req.lease() != 0) node_.ReleaseLease(req.lease());
  lock.Unlock();
  node_.writer->Flush();  // a failed shard's record, written before we answer
  return absl::OkStatus();
}

void Restorer::ReportUnconfirmed(const Job& job, const Shard& shard,
                                 ShardCopy copy, const std::string& claim,
                                 const absl::Status& checked) {
  node_.metrics->Failure(metric::kRestoreClaimUnconfirmed);
  FallbackReport fallback;
  fallback.job = job.rec.job();
  fallback.step = shard.rec.step();
  fallback.rank = shard.rec.rank();
  fallback.copy = CopyName(copy);
  fallback.next_copy = fallback.copy;  // kept: restores read it again
  fallback.verified_bad = false;
  fallback.reason = absl::StrCat(
      "the client found it bad (", claim, "), ",
      checked.ok()
          ? "but it verified"
          : absl::StrCat("but it could not be checked: ", checked.message()),
      "; kept");
  LogWarning(absl::StrCat(
      "job ", job.rec.job(), " step ", shard.rec.step(), " rank ",
      shard.rec.rank(), ": a client found the ", fallback.copy, " copy of ",
      shard.rec.path(), " bad (", claim, "), ",
      checked.ok() ? "but the daemon verified it"
                   : absl::StrCat("but it could not be checked (",
                                  checked.message(), ")"),
      "; it is kept (a client that keeps doing this suggests faulty memory "
      "or a faulty device on this node)"));
  node_.Outbox(fallback);
}

void Restorer::MarkBadCopy(Job& job, Shard& shard, ShardCopy copy,
                           const std::string& error) {
  const std::string what =
      absl::StrCat("job ", job.rec.job(), " step ", shard.rec.step(), " rank ",
                   shard.rec.rank());
  node_.metrics->Failure(metric::kRestoreChecksum);
  JobTable::DropImage(job, shard);  // its last reader frees the slot
  FallbackReport fallback;
  fallback.job = job.rec.job();
  fallback.step = shard.rec.step();
  fallback.rank = shard.rec.rank();
  fallback.copy = CopyName(copy);
  fallback.reason = absl::StrCat("failed verification: ", error);
  const bool durable = shard.phase == ShardPhase::kDurable;
  const bool in_object_tier = node_.object != nullptr && shard.uploaded;
  if (copy == ShardCopy::kMemory && durable) {
    fallback.next_copy = shard.local_gone ? "object" : "file";
    LogWarning(absl::StrCat("FALLBACK: ", what,
                            ": the copy in memory failed verification (", error,
                            "); restores read the ", fallback.next_copy,
                            " copy of ", shard.rec.path(), " next"));
    node_.Outbox(fallback);
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
    node_.Outbox(fallback);
    node_.DropLocalShard(job, shard.rec.step(), shard);
    return;
  }
  node_.Outbox(fallback);
  // No good copy left: the step is no longer restorable here, and Latest
  // offers the previous good step.
  LogWarning(absl::StrCat(
      "FALLBACK: ", what, ": ",
      copy == ShardCopy::kMemory
          ? "the copy in memory"
          : absl::StrCat("the ", fallback.copy, " copy of ", shard.rec.path()),
      " failed verification (", error,
      "); no other copy here, the step is dropped from Latest"));
  node_.FailShard(shard, absl::StrCat("failed verification: ", error));
  auto step = job.steps.find(shard.rec.step());
  if (step != job.steps.end() && step->second.manifest) {
    // The step is not whole any more: its manifest must not count.
    node_.persister->QueueDelete(
        node_.NodeManifestKey(job.rec.job(), shard.rec.step()), false);
    step->second.manifest = false;
  }
}

}  // namespace ckpt::daemon
