// Coordinator: committing the state — batches enqueued on the group
// committer, what heartbeats and watches show once a batch is durable, and
// the change counter watchers wait on.
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "util/status.h"

namespace ckpt::coordinator {

absl::Status Coordinator::CommitLocked(Batch* batch) {
  absl::Status s = store_->Commit(batch);
  if (s.ok()) return s;
  absl::Status reload = ReloadLocked();
  if (!reload.ok())
    return Annotate(s,
                    absl::StrCat("and reloading failed: ", reload.message()));
  return s;
}

void Coordinator::PutJobLocked(Batch* batch, JobState& job) {
  batch->PutJob(job.rec);
  dirty_jobs_.insert(job.rec.job());
}

void Coordinator::EnqueueLocked(std::unique_ptr<Batch> batch) {
  if (batch->empty()) return;
  uint64_t seq = committer_->Enqueue(std::move(batch));
  for (const std::string& name : dirty_jobs_) {
    auto it = jobs_.find(name);
    if (it != jobs_.end()) pending_recs_.emplace_back(seq, it->second.rec);
  }
  dirty_jobs_.clear();
  orders_.Enqueued(seq);
}

Coordinator::Txn::Txn(Coordinator* c) : c_(*c) {
  c_.mu_.Lock();
  Begin();
}

Coordinator::Txn::Txn(Coordinator* c, Adopt) : c_(*c) { Begin(); }

Coordinator::Txn::~Txn() {
  if (held_) Enqueue();
}

void Coordinator::Txn::Begin() {
  held_ = true;
  batch_ = std::make_unique<Batch>();
  c_.DetectTimeoutsLocked(batch_.get());
  if (!c_.probes_.empty()) c_.AnsweredProbesLocked(batch_.get());
}

void Coordinator::Txn::Relock() {
  c_.mu_.Lock();
  Begin();
}

void Coordinator::Txn::Enqueue() {
  c_.EnqueueLocked(std::move(batch_));
  held_ = false;
  c_.mu_.Unlock();
}

uint64_t Coordinator::Txn::EnqueueForWait() {
  uint64_t seq = 0;
  if (!batch_->empty()) {
    c_.EnqueueLocked(std::move(batch_));
    seq = c_.committer_->last_enqueued();
  }
  held_ = false;
  c_.mu_.Unlock();
  return seq;
}

absl::Status Coordinator::Txn::Commit(absl::Status result) {
  const bool wait =
      !batch_->empty();  // else nothing of this call's to wait for
  uint64_t seq = 0;
  if (wait) {
    c_.EnqueueLocked(std::move(batch_));
    seq = c_.committer_->last_enqueued();
  }
  held_ = false;
  c_.mu_.Unlock();
  if (wait) CKPT_RETURN_IF_ERROR(c_.committer_->Wait(seq));
  return result;
}

void Coordinator::OnDurable(uint64_t seq) {
  {
    absl::MutexLock lock(&mu_);
    while (!pending_recs_.empty() && pending_recs_.front().first <= seq) {
      auto it = jobs_.find(pending_recs_.front().second.job());
      if (it != jobs_.end()) {
        JobState& job = it->second;
        job.durable_rec = std::move(pending_recs_.front().second);
        job.durable_ranks_by_node.clear();
        for (uint32_t r = 0;
             r < static_cast<uint32_t>(job.durable_rec.rank_node_size()); ++r)
          job.durable_ranks_by_node[job.durable_rec.rank_node(r)].push_back(r);
      }
      pending_recs_.pop_front();
    }
    orders_.Durable(seq);
  }
  absl::MutexLock lock(&change_mu_);
  ++changes_;
  change_cv_.SignalAll();
}

uint64_t Coordinator::WaitForChange(
    uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  const absl::Time until =
      absl::Now() +
      absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(
          deadline - std::chrono::steady_clock::now()));
  absl::MutexLock lock(&change_mu_);
  while (changes_ <= seen)
    if (change_cv_.WaitWithDeadline(&change_mu_, until)) break;  // timed out
  return changes_;
}

}  // namespace ckpt::coordinator
