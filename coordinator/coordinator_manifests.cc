// Coordinator: the global manifests of the jobs' committed steps — checked
// at Open (an invalid one moves last good back; an unreadable one proves
// nothing; another write than the committed one is replaced by it), kept
// in memory and in the state for plans, and audited against a deposed
// leader's late write; the step's layout index they carry, merged at
// commit and answered to nodes (StepIndex).
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "storage/keys.h"
#include "storage/layout_format.h"
#include "storage/layout_merge.h"
#include "storage/manifest.h"
#include "util/checksum.h"
#include "util/log.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {

uint64_t Coordinator::ManifestContentDigest(storage::v1::GlobalManifest m) {
  m.clear_generation();
  m.clear_fence();
  // No map fields: the encoding of equal messages is equal.
  const std::string bytes = m.SerializeAsString();
  return Hash64(bytes.data(), bytes.size());
}

absl::Status Coordinator::ManifestInvalidLocked(const std::string& job,
                                                uint64_t step,
                                                const absl::Status& read) {
  const std::string where =
      absl::StrCat("shared_root ", options_.shared_root, ": global manifest ",
                   storage::GlobalManifestKey(job, step), " of job ", job);
  const std::string rule =
      "not starting: only a manifest that is there and corrupt makes a step "
      "invalid";
  if (read.code() == absl::StatusCode::kDataLoss) return absl::OkStatus();
  if (read.code() == absl::StatusCode::kNotFound) {
    // Removed, when the job's other keys are there; with none of them the
    // shared root is not what it was (a mount not there yet).
    absl::StatusOr<std::vector<std::string>> keys =
        shared_->List(storage::JobPrefix(job));
    if (keys.ok() && !keys->empty()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        where, " is missing, and so is every other key under ",
        storage::JobPrefix(job),
        keys.ok()
            ? ""
            : absl::StrCat(" (listing it: ", keys.status().message(), ")"),
        " (is the shared root mounted?); ", rule));
  }
  return absl::UnavailableError(
      absl::StrCat(where, " cannot be read: ", read.message(), "; ", rule));
}

std::optional<storage::v1::GlobalManifest> Coordinator::CommittedManifestLocked(
    const v1::JobRecord& rec, uint64_t step,
    const storage::v1::GlobalManifest* found) const {
  const storage::v1::GlobalManifest* kept =
      KnownManifestLocked(rec.job(), step);
  if (kept && CheckStampLocked(rec, *kept).ok()) return *kept;
  auto stamp = rec.manifest_stamps().find(step);
  if (!found || stamp == rec.manifest_stamps().end() ||
      !stamp->second.has_content_digest() ||
      ManifestContentDigest(*found) != stamp->second.content_digest())
    return std::nullopt;
  storage::v1::GlobalManifest m = *found;
  m.set_generation(stamp->second.generation());
  m.set_fence(stamp->second.fence());
  return m;
}

absl::Status Coordinator::VerifyManifestsLocked() {
  Batch batch;
  for (auto& [name, job] : jobs_) {
    while (job.rec.has_last_good()) {
      uint64_t step = job.rec.last_good_step();
      absl::StatusOr<storage::v1::GlobalManifest> m =
          storage::ReadGlobalManifest(*shared_, name, step);
      if (m.ok()) {
        absl::Status stamped = CheckStampLocked(job.rec, *m);
        if (!stamped.ok()) {
          // Not the committed write (a deposed leader's, landed late): that
          // proves nothing about the step, whose shards are whole. The
          // committed write goes back; a step is never forgotten for it.
          const std::string path =
              absl::StrCat(options_.shared_root, "/",
                           storage::GlobalManifestKey(name, step));
          std::optional<storage::v1::GlobalManifest> committed =
              CommittedManifestLocked(job.rec, step, &*m);
          if (!committed)
            return absl::FailedPreconditionError(absl::StrCat(
                path, ": ", stamped.message(),
                "; the committed write is not kept and this one lists other "
                "shards, so it cannot be rebuilt. Not starting rather than "
                "forgetting good step ",
                step, " of job ", name,
                ": put the committed manifest back, or remove this one to "
                "give the step up"));
          absl::Status written =
              storage::WriteGlobalManifest(*shared_, *committed);
          if (!written.ok())
            return absl::UnavailableError(absl::StrCat(
                path, ": ", stamped.message(),
                "; writing the committed one back failed: ", written.message(),
                "; not starting"));
          LogLocked(&batch, v1::MANIFEST_INVALID, name, "",
                    absl::StrCat("step ", step, ": ", stamped.message(),
                                 "; the committed write is back"));
          m = std::move(*committed);
        }
        RememberManifestLocked(&batch, *m);
        break;
      }
      CKPT_RETURN_IF_ERROR(ManifestInvalidLocked(name, step, m.status()));
      LogLocked(&batch, v1::MANIFEST_INVALID, name, "",
                absl::StrCat("step ", step, ": ", m.status().message()));
      auto* steps = job.rec.mutable_manifest_steps();
      steps->erase(std::remove(steps->begin(), steps->end(), step),
                   steps->end());
      job.rec.mutable_manifest_stamps()->erase(step);
      job.rec.set_has_last_good(!steps->empty());
      job.rec.set_last_good_step(
          steps->empty() ? 0 : *std::max_element(steps->begin(), steps->end()));
      batch.PutJob(job.rec);
    }
  }
  return CommitLocked(&batch);
}

void Coordinator::RememberManifestLocked(Batch* batch,
                                         const storage::v1::GlobalManifest& m) {
  auto& kept = manifests_[m.job()];
  auto same = kept.find(m.step());
  if (same != kept.end() &&
      same->second.SerializeAsString() == m.SerializeAsString())
    return;  // kept already (loaded from the state, or remembered)
  kept[m.step()] = m;
  if (m.ByteSizeLong() <= kMaxKeptManifestBytes) batch->PutManifest(m);
  auto job = jobs_.find(m.job());
  auto committed = [&](uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job == jobs_.end()) return false;
    const auto& done = job->second.rec.manifest_steps();
    return std::find(done.begin(), done.end(), step) != done.end();
  };
  while (kept.size() > kKeptManifests) {
    // Steps no longer committed go first (a rollback keeps an older step),
    // then the oldest; never the one just kept.
    auto victim =
        std::find_if(kept.begin(), kept.end(),
                     [&](const auto& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return e.first != m.step() && !committed(e.first);
                     });
    if (victim == kept.end()) {
      victim = kept.begin();
      if (victim->first == m.step()) ++victim;
    }
    batch->DeleteManifest(m.job(), victim->first);
    kept.erase(victim);
  }
}

const storage::v1::GlobalManifest* Coordinator::KnownManifestLocked(
    const std::string& job, uint64_t step) const {
  auto j = manifests_.find(job);
  if (j == manifests_.end()) return nullptr;
  auto m = j->second.find(step);
  return m == j->second.end() ? nullptr : &m->second;
}

absl::Status Coordinator::CheckStampLocked(
    const v1::JobRecord& rec, const storage::v1::GlobalManifest& m) const {
  auto stamp = rec.manifest_stamps().find(m.step());
  if (stamp == rec.manifest_stamps().end())
    return absl::OkStatus();  // committed before stamps
  if (stamp->second.generation() == m.generation() &&
      stamp->second.fence() == m.fence())
    return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "global manifest ", storage::GlobalManifestKey(m.job(), m.step()),
      " was written in generation ", m.generation(), " under fence ", m.fence(),
      ", but the commit of step ", m.step(), " refers to generation ",
      stamp->second.generation(), " fence ", stamp->second.fence(),
      " (a deposed leader's write); not trusted"));
}

absl::Status Coordinator::AuditManifests() {
  struct Audit {
    std::string job;
    uint64_t step = 0;
    v1::ManifestStamp stamp;  // of the commit
  };
  std::vector<Audit> audits;
  absl::MutexLock audit_lock(&audit_mu_);
  {
    absl::MutexLock lock(&mu_);
    const uint64_t round = audit_round_++;
    // A step no longer committed (trimmed, rolled back, its job gone)
    // leaves the audit's memory.
    for (auto it = audit_passed_.begin(); it != audit_passed_.end();) {
      auto job = jobs_.find(it->first.first);
      if (job == jobs_.end() ||
          !job->second.rec.manifest_stamps().count(it->first.second))
        it = audit_passed_.erase(it);
      else
        ++it;
    }
    for (const auto& [name, job] : jobs_) {
      // Steps committed before stamps existed cannot be checked.
      std::vector<uint64_t> steps;
      for (uint64_t st : job.rec.manifest_steps())
        if (job.rec.manifest_stamps().count(st) &&
            (!job.rec.has_last_good() || st != job.rec.last_good_step()))
          steps.push_back(st);
      std::sort(steps.begin(), steps.end());
      // The last good step every call (plans restore it); the others a few
      // at a time in turn, so that a job with many committed steps costs a
      // few reads per call, and every step is read within a bounded time.
      std::vector<uint64_t> pick;
      if (job.rec.has_last_good() &&
          job.rec.manifest_stamps().count(job.rec.last_good_step()))
        pick.push_back(job.rec.last_good_step());
      const size_t n = std::min(steps.size(), kAuditStepsPerCall);
      for (size_t i = 0; i < n; ++i)
        pick.push_back(steps[(round * kAuditStepsPerCall + i) % steps.size()]);
      for (uint64_t st : pick)
        audits.push_back({name, st, job.rec.manifest_stamps().at(st)});
    }
  }
  absl::Status first;
  for (const Audit& a : audits) {
    // The bytes an earlier audit found to be this commit's write are that
    // write still: not decoded again. Other bytes (a late write) are.
    const std::string key = storage::GlobalManifestKey(a.job, a.step);
    absl::StatusOr<std::string> text = storage::ReadManifestText(*shared_, key);
    const uint64_t text_hash =
        text.ok() ? Hash64(text->data(), text->size()) : 0;
    auto passed = audit_passed_.find({a.job, a.step});
    if (text.ok() && passed != audit_passed_.end() &&
        passed->second.text_hash == text_hash &&
        passed->second.generation == a.stamp.generation() &&
        passed->second.fence == a.stamp.fence())
      continue;
    absl::StatusOr<storage::v1::GlobalManifest> found =
        text.ok() ? storage::DecodeGlobalManifest(*text, key, a.job, a.step)
                  : absl::StatusOr<storage::v1::GlobalManifest>(text.status());
    if (found.ok() && found->generation() == a.stamp.generation() &&
        found->fence() == a.stamp.fence()) {
      audit_passed_[{a.job, a.step}] = {text_hash, a.stamp.generation(),
                                        a.stamp.fence()};
      continue;
    }
    audit_passed_.erase({a.job, a.step});
    if (!found.ok() && found.status().code() != absl::StatusCode::kDataLoss &&
        found.status().code() != absl::StatusCode::kNotFound) {
      if (first.ok()) first = found.status();  // unreadable now: nothing proven
      continue;
    }
    if (options_.leading && !options_.leading())
      return absl::UnavailableError("not leader");
    std::optional<storage::v1::GlobalManifest> committed;
    {
      // Still committed, by the same write (no rollback or new commit
      // meanwhile)?
      absl::MutexLock lock(&mu_);
      auto job = jobs_.find(a.job);
      if (job == jobs_.end()) continue;
      const v1::JobRecord& rec = job->second.rec;
      const auto& done = rec.manifest_steps();
      auto stamp = rec.manifest_stamps().find(a.step);
      if (std::find(done.begin(), done.end(), a.step) == done.end() ||
          stamp == rec.manifest_stamps().end() ||
          stamp->second.SerializeAsString() != a.stamp.SerializeAsString())
        continue;
      committed =
          CommittedManifestLocked(rec, a.step, found.ok() ? &*found : nullptr);
      if (!committed && !audit_unrebuilt_.insert({a.job, a.step}).second)
        continue;  // named already
    }
    absl::Status written =
        committed ? storage::WriteGlobalManifest(*shared_, *committed)
                  : absl::FailedPreconditionError(
                        "the committed write is not kept and this one lists "
                        "other shards: not rebuilt; a rollback to the step is "
                        "refused until the committed manifest is back");
    Txn txn(this);
    LogLocked(
        txn.batch(), v1::MANIFEST_INVALID, a.job, "",
        absl::StrCat(
            "step ", a.step, ": ",
            found.ok()
                ? absl::StrCat("MANIFEST.global was written in generation ",
                               found->generation(), " under fence ",
                               found->fence())
                : std::string(found.status().message()),
            ", not the committed write (generation ", a.stamp.generation(),
            ", fence ", a.stamp.fence(), "); ",
            written.ok()
                ? "written again"
                : absl::StrCat(committed ? "writing it again failed: " : "",
                               written.message())));
    absl::Status durable = txn.Commit();
    if (first.ok() && !written.ok()) first = written;
    if (first.ok() && !durable.ok()) first = durable;
  }
  return first;
}

void Coordinator::MergeStepIndex(PendingCommit& c) const {
  if (c.rank_indexes.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string_view> blobs;
  blobs.reserve(c.rank_indexes.size());
  for (const auto& b : c.rank_indexes) blobs.emplace_back(*b);
  absl::StatusOr<storage::LayoutIndex> merged =
      storage::MergeRankLayoutIndexes(blobs);
  c.rank_indexes.clear();  // the blobs stay with the job's records
  if (!merged.ok()) {
    LogWarning(absl::StrCat("job ", c.job, " step ", c.step,
                            ": the ranks' layout indexes do not merge (",
                            merged.status().message(),
                            "); MANIFEST.global goes without one"));
    return;
  }
  c.manifest.set_layout_index(storage::SerializeLayoutIndex(*merged));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (seconds > 1.0)
    LogInfo(absl::StrCat("job ", c.job, " step ", c.step, ": layout index of ",
                         merged->num_pieces(), " pieces, ",
                         c.manifest.layout_index().size(), " bytes, merged in ",
                         seconds, " s"));
}

absl::StatusOr<v1::StepIndexResponse> Coordinator::StepIndex(
    const v1::StepIndexRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  v1::StepIndexResponse resp;
  uint64_t content_digest = 0;
  {
    absl::MutexLock lock(&mu_);
    CKPT_RETURN_IF_ERROR(CheckEpochLocked(req.node_id(), req.epoch()));
    auto job = jobs_.find(req.job());
    if (job == jobs_.end())
      return absl::NotFoundError(
          absl::StrCat("job: unknown job '", req.job(), "'"));
    const v1::JobRecord& rec = job->second.rec;
    const auto& done = rec.manifest_steps();
    if (std::find(done.begin(), done.end(), req.step()) == done.end())
      return absl::NotFoundError(absl::StrCat("step: ", req.step(), " of job '",
                                              req.job(), "' is not committed"));
    auto stamp = rec.manifest_stamps().find(req.step());
    if (stamp != rec.manifest_stamps().end() &&
        stamp->second.has_content_digest()) {
      content_digest = stamp->second.content_digest();
      resp.set_content_digest(content_digest);
      // The node holds this write's index already (it was answered it, so
      // the step has one): nothing to move.
      if (req.known_content_digest() == content_digest) {
        resp.set_unchanged(true);
        return resp;
      }
    }
    if (const storage::v1::GlobalManifest* kept =
            KnownManifestLocked(req.job(), req.step());
        kept && CheckStampLocked(rec, *kept).ok()) {
      if (!kept->has_layout_index())
        return absl::NotFoundError(
            absl::StrCat("step: ", req.step(), " of job '", req.job(),
                         "' was committed without a layout index"));
      resp.set_index(kept->layout_index());
      resp.set_world_size(kept->world_size());
      return resp;
    }
    if (content_digest == 0)
      return absl::NotFoundError(absl::StrCat(
          "step: ", req.step(), " of job '", req.job(),
          "' was committed before manifests carried a layout index"));
  }
  // Not kept: read from the shared root without the state mutex, and
  // answered only when it is the committed write.
  CKPT_ASSIGN_OR_RETURN(
      storage::v1::GlobalManifest m,
      storage::ReadGlobalManifest(*shared_, req.job(), req.step()));
  if (ManifestContentDigest(m) != content_digest)
    return absl::NotFoundError(
        absl::StrCat(storage::GlobalManifestKey(req.job(), req.step()),
                     " is not the committed write of step ", req.step()));
  if (!m.has_layout_index())
    return absl::NotFoundError(
        absl::StrCat("step: ", req.step(), " of job '", req.job(),
                     "' was committed without a layout index"));
  resp.set_index(std::move(*m.mutable_layout_index()));
  resp.set_world_size(m.world_size());
  return resp;
}

}  // namespace ckpt::coordinator
