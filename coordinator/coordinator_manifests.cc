// Coordinator: the global manifests of the jobs' last good steps — checked
// at Open (an invalid one moves last good back; an unreadable one proves
// nothing), kept in memory for plans, and audited against a deposed
// leader's late write.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "util/status.h"

namespace ckpt::coordinator {

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

absl::Status Coordinator::VerifyManifestsLocked() {
  Batch batch;
  for (auto& [name, job] : jobs_) {
    while (job.rec.has_last_good()) {
      uint64_t step = job.rec.last_good_step();
      absl::StatusOr<storage::v1::GlobalManifest> m =
          storage::ReadGlobalManifest(*shared_, name, step);
      if (m.ok())
        m = [&]() -> absl::StatusOr<storage::v1::GlobalManifest> {
          absl::Status stamped = CheckStampLocked(job.rec, *m);
          if (stamped.ok()) return std::move(*m);
          // Not the committed write (a deposed leader's, landed late). This
          // process kept the committed one (a reload after a failed write):
          // it goes back to the shared root. Otherwise the step is invalid.
          const storage::v1::GlobalManifest* kept =
              KnownManifestLocked(name, step);
          if (kept && CheckStampLocked(job.rec, *kept).ok() &&
              storage::WriteGlobalManifest(*shared_, *kept).ok())
            return *kept;
          return stamped;
        }();
      if (m.ok()) {
        RememberManifestLocked(*m);
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

void Coordinator::RememberManifestLocked(const storage::v1::GlobalManifest& m) {
  auto& kept = manifests_[m.job()];
  kept[m.step()] = m;
  while (kept.size() > 2) kept.erase(kept.begin());
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
  struct Expect {
    std::string job;
    storage::v1::GlobalManifest manifest;  // the committed write
  };
  std::vector<Expect> expect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, job] : jobs_) {
      if (!job.rec.has_last_good()) continue;
      const storage::v1::GlobalManifest* kept =
          KnownManifestLocked(name, job.rec.last_good_step());
      if (kept && job.rec.manifest_stamps().count(kept->step()) &&
          CheckStampLocked(job.rec, *kept).ok())
        expect.push_back({name, *kept});
    }
  }
  absl::Status first;
  for (Expect& e : expect) {
    const uint64_t step = e.manifest.step();
    absl::StatusOr<storage::v1::GlobalManifest> found =
        storage::ReadGlobalManifest(*shared_, e.job, step);
    if (found.ok() && found->generation() == e.manifest.generation() &&
        found->fence() == e.manifest.fence())
      continue;
    if (!found.ok() && found.status().code() != absl::StatusCode::kDataLoss &&
        found.status().code() != absl::StatusCode::kNotFound) {
      if (first.ok()) first = found.status();  // unreadable now: nothing proven
      continue;
    }
    if (options_.leading && !options_.leading())
      return absl::UnavailableError("not leader");
    {
      // Still the committed write (no rollback or new commit meanwhile)?
      std::lock_guard<std::mutex> lock(mu_);
      auto job = jobs_.find(e.job);
      if (job == jobs_.end() || !job->second.rec.has_last_good() ||
          job->second.rec.last_good_step() != step ||
          !CheckStampLocked(job->second.rec, e.manifest).ok())
        continue;
    }
    absl::Status written = storage::WriteGlobalManifest(*shared_, e.manifest);
    Lock lock(mu_);
    auto batch = std::make_unique<Batch>();
    LogLocked(
        batch.get(), v1::MANIFEST_INVALID, e.job, "",
        absl::StrCat(
            "step ", step, ": ",
            found.ok()
                ? absl::StrCat("MANIFEST.global was written in generation ",
                               found->generation(), " under fence ",
                               found->fence())
                : std::string(found.status().message()),
            ", not the committed write (generation ", e.manifest.generation(),
            ", fence ", e.manifest.fence(), "); ",
            written.ok() ? "written again"
                         : absl::StrCat("writing it again failed: ",
                                        written.message())));
    absl::Status committed = Commit(lock, std::move(batch));
    if (first.ok() && !written.ok()) first = written;
    if (first.ok() && !committed.ok()) first = committed;
  }
  return first;
}

}  // namespace ckpt::coordinator
