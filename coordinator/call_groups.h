// CallGroups: calls that each need the state lock and a durable write
// (ReportShards) run in groups, not one by one (flat combining). A thread
// bringing a call queues it; the first to find no group running takes up
// to `max_group` queued calls (its own among them, or not yet) and applies
// them together: one hold of the state lock, one batch, one group-commit
// wait, where N calls took N lock hand-offs (each a thread switch on a
// loaded node) and refused the herd beyond the workers. `apply` returns
// the group's second half (the durable wait, the answers), run after the
// role has passed on, so the next group is applied while this one's
// write syncs. A thread returns once its own call is finished.
// Thread-safe.
#ifndef CKPT_COORDINATOR_CALL_GROUPS_H_
#define CKPT_COORDINATOR_CALL_GROUPS_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::coordinator {

template <typename Call>
class CallGroups {
 public:
  // Applies a group under the caller's locks; returns what finishes it.
  using Apply =
      std::function<std::function<void()>(const std::vector<Call*>& group)>;

  explicit CallGroups(size_t max_group)
      : max_group_(max_group ? max_group : 1) {}
  CallGroups(const CallGroups&) = delete;
  CallGroups& operator=(const CallGroups&) = delete;

  // Runs `call` in a group (perhaps another thread's) and returns when it
  // is finished.
  void Run(Call* call, const Apply& apply) ABSL_LOCKS_EXCLUDED(mu_) {
    Slot mine{call};
    mu_.Lock();
    queue_.push_back(&mine);
    while (!mine.done) {
      if (running_ || queue_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      running_ = true;
      std::vector<Slot*> slots;
      while (!queue_.empty() && slots.size() < max_group_) {
        slots.push_back(queue_.front());
        queue_.pop_front();
      }
      std::vector<Call*> group;
      group.reserve(slots.size());
      for (Slot* s : slots) group.push_back(s->call);
      ++groups_;
      mu_.Unlock();
      std::function<void()> finish = apply(group);
      mu_.Lock();
      running_ = false;
      cv_.SignalAll();  // the next group may start
      mu_.Unlock();
      if (finish) finish();
      mu_.Lock();
      for (Slot* s : slots) s->done = true;
      cv_.SignalAll();
    }
    mu_.Unlock();
  }

  // Calls queued, not yet taken into a group.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }
  // Blocks until at least `n` calls are queued (tests).
  void AwaitWaiting(size_t n) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.size() >= n;
    };
    mu_.Await(absl::Condition(&enough));
  }
  // Groups applied so far.
  size_t groups() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return groups_;
  }

 private:
  struct Slot {
    Call* call;
    bool done = false;
  };
  const size_t max_group_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Slot*> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  size_t groups_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CALL_GROUPS_H_
