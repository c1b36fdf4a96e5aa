// GroupCommitter: one writer thread that makes the coordinator's batches
// durable in the order they were enqueued, as many at a time as are
// waiting (one synced write for all of them: group commit). Callers enqueue
// under the coordinator's state mutex (so the order of batches is the order
// of the state changes) and wait for durability after releasing it.
//
// On a failed write every batch of that group and every batch still queued
// fails with the write's status, and `on_failure` runs on the writer thread
// (the coordinator reloads its memory from the store there, holding its
// state mutex, which it takes before calling FailQueued).
// Thread-safe. The destructor commits what is queued, then stops.
#ifndef CKPT_COORDINATOR_GROUP_COMMIT_H_
#define CKPT_COORDINATOR_GROUP_COMMIT_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "coordinator/store.h"

namespace ckpt::coordinator {

class GroupCommitter {
 public:
  GroupCommitter(CoordStore* store,
                 std::function<void(const absl::Status&)> on_failure,
                 std::function<void(uint64_t)> on_durable);
  ~GroupCommitter();

  // Queues a non-empty batch; returns its sequence number.
  uint64_t Enqueue(std::unique_ptr<CoordStore::Batch> batch);
  // The sequence number of the last batch queued (0: none).
  uint64_t last_enqueued() const;
  // Until batch `seq` (and so every earlier one) is durable or failed.
  [[nodiscard]] absl::Status Wait(uint64_t seq);
  // Fails every batch queued and not yet taken by the writer.
  void FailQueued(const absl::Status& why);
  uint64_t groups_written() const;

 private:
  void Loop();
  void MarkDone(uint64_t upto, const absl::Status& s);

  CoordStore* const store_;
  const std::function<void(const absl::Status&)> on_failure_;
  const std::function<void(uint64_t)> on_durable_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::unique_ptr<CoordStore::Batch>>> queue_;
  uint64_t next_seq_ = 1;
  uint64_t done_seq_ = 0;
  // Failed ranges [first, last] with their status; rare, so a short list.
  std::deque<std::pair<std::pair<uint64_t, uint64_t>, absl::Status>> failed_;
  uint64_t groups_ = 0;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_GROUP_COMMIT_H_
