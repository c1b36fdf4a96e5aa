// Replicator (replicator.h): the replicate stage's queue and thread.
#include "daemon/replica/replicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/replica/replica_service.h"
#include "util/thread_priority.h"

namespace ckpt::daemon {

Replicator::Replicator(ReplicatorOptions options)
    : options_(std::move(options)), limit_(options_.bandwidth) {}

Replicator::~Replicator() { Stop(); }

void Replicator::Start(StagedShards* staged) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ = staged;
  }
  thread_ = std::thread(&Replicator::Loop, this);
}

void Replicator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cancel_.Cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Replicator::Staged(const std::string& job, uint64_t step, uint32_t rank,
                        bool durable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (staged_ == nullptr) return;  // not started
  Rank& r = ranks_[{job, rank}];
  // An older step becoming durable says nothing new: the rank's newest is
  // whatever was committed last (a rollback's smaller step included).
  if (durable && r.step != 0 && step != r.step) return;
  // A save of an older step after a rollback is the rank's newest too: the
  // holder orders copies by (generation, step) and takes it.
  if (r.step == step && r.done && !r.waiting) return;
  r.waiting = false;
  if (r.step != step) {
    r.step = step;
    r.attempts = 0;
    r.not_before = {};
  }
  r.done = false;
  cv_.notify_all();
}

void Replicator::SetTarget(std::optional<ReplicaPeer> target) {
  std::lock_guard<std::mutex> lock(mu_);
  if (target_ == target) return;
  LogInfo(target ? absl::StrCat("replica target: ", target->node_id, " at ",
                                target->host, ":", target->port)
                 : std::string("replica target: none"));
  target_ = std::move(target);
  cancel_.Cancel();  // the send in flight, if any, was to the old target
  channel_.reset();
  refused_.reset();
  for (auto& [key, r] : ranks_) {
    r.done = false;
    r.attempts = 0;
    r.not_before = {};
  }
  cv_.notify_all();
}

std::optional<HolderRefusal> Replicator::Refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

ReplicatorStats Replicator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReplicatorStats s = stats_;
  s.pending = 0;
  for (const auto& [key, r] : ranks_) s.pending += r.done ? 0 : 1;
  return s;
}

std::optional<Replicator::Key> Replicator::NextLocked(
    std::chrono::steady_clock::time_point* wake) {
  const auto now = std::chrono::steady_clock::now();
  *wake = now + std::chrono::seconds(1);
  if (!target_) return std::nullopt;
  std::optional<Key> best;
  for (const auto& [key, r] : ranks_) {
    if (r.done) continue;
    if (r.not_before > now) {
      *wake = std::min(*wake, r.not_before);
      continue;
    }
    return key;
  }
  return best;
}

void Replicator::Loop() {
  // Its copies (send, and on loopback the receive too) must not take the
  // training step's CPU (util/thread_priority.h).
  RunThisThreadInBackground("ckpt-replicate");
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    std::chrono::steady_clock::time_point wake;
    std::optional<Key> key = NextLocked(&wake);
    if (!key) {
      cv_.wait_until(lock, wake);
      continue;
    }
    const uint64_t step = ranks_[*key].step;
    const ReplicaPeer target = *target_;
    cancel_.Reset();  // SetTarget and Stop cancel under mu_: none missed
    lock.unlock();
    SendOne(*key, step, target);
    lock.lock();
  }
}

void Replicator::SendOne(const Key& key, uint64_t step,
                         const ReplicaPeer& target) {
  const auto& [job, rank] = key;
  absl::Status status;
  bool overwritten = false;
  uint64_t bytes = 0;
  absl::StatusOr<StagedCopy> snap = staged_->SnapshotStaged(job, step, rank);
  if (snap.ok()) {
    std::shared_ptr<grpc::Channel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      channel = channel_;
    }
    if (!channel) {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> made = ReplicaChannel(
          options_.tls, target.node_id, target.host, target.port);
      status = made.status();
      if (made.ok()) {
        channel = *made;
        std::lock_guard<std::mutex> lock(mu_);
        if (target_ == target) channel_ = channel;
      }
    }
    if (status.ok()) {
      snap->copy.set_source_node(options_.node_id);
      bytes = snap->copy.image_bytes();
      PutOptions put;
      put.limit = &limit_;
      put.cancel = &cancel_;
      put.corrupt = options_.corrupt;
      const double rate = options_.bandwidth ? options_.bandwidth : 100e6;
      put.deadline = std::chrono::system_clock::now() + options_.put_deadline +
                     std::chrono::milliseconds(static_cast<int64_t>(
                         2000.0 * static_cast<double>(bytes) / rate));
      status = SendReplica(options_.transport, *channel, target.host,
                           snap->copy, snap->data(), put)
                   .status();
      overwritten = !staged_->StagedUnchanged(job, rank, *snap);
    }
  } else {
    status = snap.status();
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Cancelled by SetTarget (which queued every rank again) or Stop.
  if (status.code() == absl::StatusCode::kCancelled &&
      (stopping_ || !(target_ == target)))
    return;
  auto it = ranks_.find(key);
  if (it == ranks_.end()) return;
  Rank& r = it->second;
  const bool same = r.step == step && target_ == target;
  if (status.ok() && same && overwritten) {
    // The holder verified what it got, so those were the shard's bytes.
    LogInfo(absl::StrCat("replica of job '", job, "' step ", step,
                         " sent while a save reused its slot; it verified"));
  }
  // The holder has this very copy already (sent again to a new target).
  const bool held_already =
      snap.ok() && status.code() == absl::StatusCode::kAlreadyExists;
  if (target_ == target && status.code() != absl::StatusCode::kCancelled) {
    // What the target said last: room, or none (the coordinator is told).
    const bool no_room =
        status.code() == absl::StatusCode::kResourceExhausted &&
        status.message().find("replica_memory_bytes") != std::string::npos;
    // It keeps a copy of the rank it takes for newer (one of a job that
    // had this name before, or a stale claim): no copy of this rank gets
    // there, so the coordinator is told as for want of room.
    const bool holds_newer =
        snap.ok() && status.code() == absl::StatusCode::kFailedPrecondition;
    if ((no_room || holds_newer) && !refused_)
      LogWarning(absl::StrCat(
          "replica target ", target.node_id, " refuses this node's copies (",
          status.message(), "); the coordinator is told with each heartbeat"));
    if (no_room || holds_newer)
      refused_ = HolderRefusal{target.node_id, std::string(status.message())};
    else if (status.ok() || held_already)
      refused_.reset();
  }
  if (status.ok() || held_already) {
    // A copy of the rank completed: a run of overwritten ones ends.
    r.overwritten_run = 0;
    r.warned = false;
  }
  if (status.ok()) {
    ++stats_.sent;  // the holder verified and kept it
    stats_.sent_bytes += bytes;
    if (same) r.done = true;
    return;  // else a newer step or target: it is due now
  }
  if (held_already) {
    if (same) r.done = true;
    return;
  }
  if (snap.ok() && overwritten) {
    // A save took the slot: its own Staged() queued the newer shard.
    ++stats_.overwritten;
    ++stats_.overwritten_by_job[job];
    if (same) r.done = true;
    ++r.overwritten_run;
    const uint32_t after = options_.warn_overwritten_after;
    if (after == 0 || r.overwritten_run < after || r.warned) return;
    r.warned = true;
    ++stats_.overwritten_warnings;
    const std::string warning = absl::StrCat(
        "replica copies of job '", job, "' rank ", rank, " to ", target.node_id,
        " were overwritten ", r.overwritten_run,
        " times in a row and none completed: a copy streams from the slot "
        "the next-but-one save reuses, and this sender is slower than two "
        "saves, so the rank's replica is no newer than its last completed "
        "copy (the last: ",
        status.message(),
        "). Give the job more slots (ckptd --slots), save less often, or "
        "give the replicas more bandwidth (--replica-bandwidth, the link); "
        "warned once until a copy of this rank completes");
    lock.unlock();
    LogWarning(warning);
    return;
  }
  if (!snap.ok() && snap.status().code() == absl::StatusCode::kUnavailable) {
    // A device tensor's checksum is not known yet: the durable report
    // (Staged again) brings it.
    if (same) r.done = r.waiting = true;
    return;
  }
  if (!snap.ok() && (status.code() == absl::StatusCode::kNotFound ||
                     status.code() == absl::StatusCode::kFailedPrecondition)) {
    // The shard is gone from memory (superseded, dropped).
    if (same) r.done = true;
    return;
  }
  ++stats_.failed;
  stats_.last_error = std::string(status.message());
  if (!same) return;
  ++r.attempts;
  auto delay =
      options_.retry_delay * (1u << std::min<uint32_t>(r.attempts, 10));
  delay = std::min<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(delay),
      options_.max_retry_delay);
  r.not_before = std::chrono::steady_clock::now() + delay;
  if (r.attempts <= 3 || r.attempts % 20 == 0)
    LogWarning(absl::StrCat("replica of job '", job, "' step ", step, " rank ",
                            rank, " to ", target.node_id, " failed (attempt ",
                            r.attempts, "): ", status.message()));
}

}  // namespace ckpt::daemon
