// The job table's lookups, transitions and queries. See job_table.h.
#include "daemon/state/job_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "util/log.h"
#include "util/validate.h"

namespace ckpt::daemon {

absl::StatusOr<Job*> JobTable::FindFor(const std::string& name,
                                       const PeerCreds& peer) {
  absl::Status valid = ValidateJobName(name);
  if (!valid.ok()) return valid;
  auto it = jobs_.find(name);
  if (it == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job: unknown job '", name, "'"));
  if (peer.uid != 0 && peer.uid != it->second.rec.uid())
    return absl::PermissionDeniedError(
        absl::StrCat("job '", name, "' belongs to uid ", it->second.rec.uid(),
                     ", caller is uid ", peer.uid));
  return &it->second;
}

Job* JobTable::Find(const std::string& name) {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Job* JobTable::Find(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<Job*> JobTable::FindOrAdd(const std::string& name, uint32_t uid,
                                         uint32_t world_size,
                                         uint32_t num_slots,
                                         std::optional<uint64_t> generation) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    // Recorded in the catalog only once its first arena exists.
    Job job;
    job.rec.set_job(name);
    job.rec.set_world_size(world_size);
    job.rec.set_uid(uid);
    job.rec.set_num_slots(num_slots);
    job.rec.set_slot_bytes(0);
    job.rec.set_life_ns(NewJobLife());
    job.recorded = false;
    job.registered_generation = generation;
    it = jobs_.emplace(name, std::move(job)).first;
  }
  Job& job = it->second;
  if (uid != job.rec.uid())
    return absl::PermissionDeniedError(
        absl::StrCat("job '", name, "' belongs to uid ", job.rec.uid(),
                     ", caller is uid ", uid));
  const bool newer =
      generation.has_value() && (!job.registered_generation.has_value() ||
                                 *generation > *job.registered_generation);
  if (world_size != job.rec.world_size()) {
    if (!newer)
      return absl::InvalidArgumentError(absl::StrCat(
          "world_size: ", world_size, ", but job '", name, "' has ",
          job.rec.world_size(),
          " (a job changes size only under a newer generation of its "
          "launcher's plan, $CKPT_GENERATION; ",
          generation.has_value()
              ? absl::StrCat("this trainer's is ", *generation, ", the job's ",
                             job.registered_generation.value_or(0))
              : std::string("this trainer has none"),
          ")"));
    // Elastic continuation: the job's launcher restarted it at another
    // world size (a plan after a lost node, or one that grows it back).
    // Its shards keep the world size they were saved at; the job's is its
    // trainers' from now on (written with the next record of the job).
    LogInfo(absl::StrCat("job ", name, ": world size ", job.rec.world_size(),
                         " -> ", world_size, " (generation ", *generation,
                         ")"));
    job.rec.set_world_size(world_size);
  }
  if (newer) job.registered_generation = generation;
  return &job;
}

Job& JobTable::Add(Job job) {
  std::string name = job.rec.job();
  return jobs_.emplace(std::move(name), std::move(job)).first->second;
}

void JobTable::EraseIfUnrecorded(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end() || it->second.recorded) return;
  for (const auto& [r, rank] : it->second.ranks)
    if (rank.arena || rank.creating) return;
  jobs_.erase(it);
}

bool JobTable::Unused(const Job& job) const {
  if (!job.steps.empty() || leases_.AnyForJob(job.rec.job())) return false;
  for (const auto& [r, rank] : job.ranks) {
    if (rank.creating) return false;
    for (const Slot& s : rank.slots)
      if (s.state != shm::SlotState::kFree) return false;
  }
  return true;
}

absl::StatusOr<RankSlots*> JobTable::FindRank(Job& job, uint32_t rank) {
  if (rank >= job.rec.world_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is not below world_size ", job.rec.world_size()));
  auto it = job.ranks.find(rank);
  if (it == job.ranks.end() || !it->second.arena)
    return absl::FailedPreconditionError(
        absl::StrCat("rank: rank ", rank, " of job '", job.rec.job(),
                     "' is not registered"));
  return &it->second;
}

Shard* JobTable::FindShard(const std::string& job, uint64_t step,
                           uint32_t rank) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto st = j->second.steps.find(step);
  if (st == j->second.steps.end()) return nullptr;
  auto sh = st->second.shards.find(rank);
  return sh == st->second.shards.end() ? nullptr : &sh->second;
}

bool JobTable::MoveShard(Job& job, Shard& shard, ShardPhase to) {
  if (!shard.MoveTo(to)) return false;
  if (shard.slot < 0) return true;
  auto rank = job.ranks.find(shard.rec.rank());
  if (rank != job.ranks.end() && rank->second.arena)
    rank->second.SetState(static_cast<uint32_t>(shard.slot),
                          SlotStateOf(shard.phase));
  return true;
}

uint64_t JobTable::AddCommitted(Job& job, RankSlots& rank, uint32_t slot,
                                Shard shard) {
  shard.gen = NextGen();
  const uint64_t gen = shard.gen;
  rank.Hold(slot, SlotStateOf(shard.phase), shard.rec.step(), gen,
            shard.info.layout.image_bytes);
  job.steps[shard.rec.step()].shards[shard.rec.rank()] = std::move(shard);
  job.forget_when_idle = false;
  return gen;
}

bool JobTable::FailShard(Shard& shard, const std::string& error) {
  if (!shard.MoveTo(ShardPhase::kFailed)) return false;
  shard.rec.set_error(error);
  Wake(Waiter::kDurable);
  return true;
}

void JobTable::DropImage(Job& job, Shard& shard) {
  if (shard.slot < 0) return;
  auto rank = job.ranks.find(shard.rec.rank());
  if (rank != job.ranks.end()) rank->second.DropShard(shard.slot, shard.gen);
  shard.slot = -1;
  shard.slot_copy = ShardCopy::kMemory;
}

std::vector<std::pair<uint64_t, Shard*>> JobTable::DetachSlot(Job& job,
                                                              uint32_t rank_no,
                                                              int slot) {
  std::vector<std::pair<uint64_t, Shard*>> detached;
  for (auto& [n, step] : job.steps) {
    auto sh = step.shards.find(rank_no);
    if (sh == step.shards.end() || sh->second.slot < 0) continue;
    if (slot != kAnySlot && sh->second.slot != slot) continue;
    sh->second.slot = -1;
    detached.emplace_back(n, &sh->second);
  }
  return detached;
}

bool JobTable::EraseShard(Job& job, uint64_t step_no, uint32_t rank) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return false;
  auto sh = step->second.shards.find(rank);
  if (sh == step->second.shards.end()) return false;
  auto r = job.ranks.find(rank);
  if (r != job.ranks.end())
    r->second.DropShard(sh->second.slot, sh->second.gen);
  step->second.shards.erase(sh);
  // The step is no longer whole: neither manifest counts.
  step->second.manifest = false;
  step->second.object_manifest = false;
  if (step->second.shards.empty()) job.steps.erase(step);
  Wake(Waiter::kSlot);
  Wake(Waiter::kDurable);
  return true;
}

std::optional<Lease> JobTable::ReleaseLease(uint64_t id) {
  std::optional<Lease> lease = leases_.Remove(id);
  if (!lease || !lease->file_key.empty()) return lease;
  Job* job = Find(lease->job);
  if (job == nullptr) return lease;
  auto rank = job->ranks.find(lease->rank);
  if (rank == job->ranks.end() || !rank->second.arena ||
      lease->slot >= rank->second.slots.size())
    return lease;
  if (lease->write)
    rank->second.EndWrite(lease->slot, id);
  else
    rank->second.EndRead(lease->slot);
  Wake(Waiter::kSlot);
  return lease;
}

bool JobTable::RecordPrefaulted(const std::shared_ptr<shm::Arena>& arena,
                                const absl::Status& status, bool registered) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, job] : jobs_)
    for (auto& [r, rank] : job.ranks)
      if (rank.arena == arena) {
        rank.registered = registered;
        if (status.ok())
          rank.ready_slots = arena->num_slots();
        else
          rank.reserve_error = status;
        Wake(Waiter::kSlot);
        return true;
      }
  return false;
}

bool JobTable::WaitUntil(Waiter w,
                         std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return false;
  // absl::CondVar waits for a duration; the callers' deadlines are steady.
  cv(w).WaitWithTimeout(&mu_, absl::FromChrono(deadline - now));
  return std::chrono::steady_clock::now() < deadline;
}

void JobTable::EndFetch(const std::string& job, uint64_t step, uint32_t rank) {
  if (auto it = fetching_.find({job, step, rank}); it != fetching_.end())
    fetching_.erase(it);
  Wake(Waiter::kFetch);
}

const Hosting* JobTable::HostingOf(const std::string& job) const {
  auto it = hosted_.find(job);
  return it == hosted_.end() ? nullptr : &it->second;
}

bool JobTable::SetHosting(const std::string& job, Hosting now) {
  Hosting& hosted = hosted_[job];
  if (hosted.ranks == now.ranks && hosted.keep_from == now.keep_from)
    return false;
  hosted = std::move(now);
  return true;
}

bool JobTable::StepComplete(const Job& job, const Step& step,
                            bool* durable) const {
  return daemon::StepComplete(step, job.rec.world_size(),
                              HostingOf(job.rec.job()), durable);
}

size_t JobTable::NotDurable() const {
  size_t n = 0;
  for (const auto& [name, job] : jobs_) n += InFlightOf(job).shards;
  return n;
}

JobTable::InFlight JobTable::InFlightOf(const Job& job) {
  InFlight in;
  for (const auto& [n, step] : job.steps) {
    bool pending = false;
    for (const auto& [r, shard] : step.shards) {
      if (shard.phase != ShardPhase::kStaged &&
          shard.phase != ShardPhase::kPersisting)
        continue;
      pending = true;
      ++in.shards;
      in.bytes += shard.rec.image_bytes();
    }
    if (pending) ++in.steps;
  }
  return in;
}

}  // namespace ckpt::daemon
