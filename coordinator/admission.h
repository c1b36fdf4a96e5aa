// KindQueue: admission for one kind of call (heartbeats, reports,
// registrations), served on the coordinator's own threads, never on
// gRPC's. A callback handler (service.cc) admits its call here and returns
// at once; one of `workers` threads runs it (taking the state lock and, for
// calls that must be durable, waiting for the group commit), then answers.
// At most `capacity` calls of the kind are admitted (running or waiting);
// beyond, TryRun refuses and the caller answers RESOURCE_EXHAUSTED with a
// retry-after (RetryAfterMs: `base_ms` to 3 x base_ms, uniformly, so the
// refused herd comes back spread out). Kinds do not share a bound: a
// registration storm cannot take what heartbeats and reports need.
// Thread-safe. Stop() runs what was admitted, then joins the workers.
#ifndef CKPT_COORDINATOR_ADMISSION_H_
#define CKPT_COORDINATOR_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::coordinator {

class KindQueue {
 public:
  KindQueue(std::string kind, int workers, int capacity, int base_retry_ms);
  ~KindQueue();
  KindQueue(const KindQueue&) = delete;
  KindQueue& operator=(const KindQueue&) = delete;

  // Admits `call` (it will run) or refuses it (false: nothing will run).
  [[nodiscard]] bool TryRun(std::function<void()> call);
  // Runs `call` on the caller's thread, counted against the bound while it
  // runs as an admitted call is, if the bound allows: false, with nothing
  // run and nothing counted as refused, if it does not (the caller then
  // goes through TryRun). `call` returns whether it answered the call.
  [[nodiscard]] bool TryRunHere(const std::function<bool()>& call);
  // 0 refuses every call (an operator shedding load, or a test).
  void SetCapacity(int capacity) {
    capacity_.store(capacity < 0 ? 0 : capacity);
  }
  // A jittered retry-after for a refused caller, in milliseconds.
  int RetryAfterMs();
  const std::string& kind() const { return kind_; }
  uint64_t refused() const { return refused_.load(); }
  void Stop();

 private:
  void Loop();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string kind_;
  const int base_retry_ms_;
  std::atomic<int> capacity_;
  std::atomic<int> admitted_{0};  // queued + running
  std::atomic<uint64_t> refused_{0};
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_ADMISSION_H_
