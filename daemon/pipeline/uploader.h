// Uploader: the object tier's own queue and threads (doc/object-tier.md).
// A step goes memory -> local disk (the Persister) -> object store (here):
// the engine queues a shard's upload once its local file is durable, the
// step's object manifest once every shard is uploaded, and retention's
// deletes (manifest first). A slow or failing store backs up only this
// queue: saves and local persists never wait for it.
//
// The uploader runs deletes itself (in order, stopping at the first
// failure so a step's shards never go before its manifest) and hands
// shard and manifest tasks to the `run` callback of its owner, the
// PersistPipeline (pipeline.h), which takes the engine mutex only to read
// and record state, never across network I/O.
// A task whose run fails is re-queued with exponential backoff (capped),
// without limit: the store may come back; each failure is counted and the
// last error kept for Status.
//
// Tasks that touch the same key (an object, a manifest) run one at a time,
// in the order they were pushed, a retry keeping its place: an upload of an
// older generation, or a delete that failed once, never lands after a
// newer write of the key. Tasks on different keys run in parallel.
//
// Thread-safety: all methods are safe to call concurrently. The uploader
// has its own mutex, never held while a task runs. Lock order: the engine
// may call Push with its mutex held; `run` takes the engine mutex, and is
// called without the uploader's.
#ifndef CKPT_DAEMON_PIPELINE_UPLOADER_H_
#define CKPT_DAEMON_PIPELINE_UPLOADER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/clock.h"
#include "storage/backend.h"

namespace ckpt::daemon {

struct UploadTask {
  enum Kind { kShard, kManifest, kDelete } kind = kShard;
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint64_t gen = 0;    // kShard: the generation of the shard to upload
  uint64_t bytes = 0;  // kShard: counted in the backlog
  // The keys the task writes or deletes: kShard the shard's object,
  // kManifest the step's manifest; kDelete deletes them in this order (a
  // failure keeps the rest for a retry).
  std::vector<std::string> keys{};
  std::chrono::steady_clock::time_point not_before{};
  uint32_t attempts = 0;
  uint64_t seq = 0;     // set by Push: the task's place in the queue
  uint64_t intent = 0;  // kDelete: its record in the catalog (0: none)
  // kDelete: the catalog edit recording the intent (CatalogWriter ticket,
  // 0: none); the delete waits until it is written.
  uint64_t ticket = 0;
};

// What Status and metrics show of the object tier.
struct UploadBacklog {
  uint32_t steps = 0;  // distinct (job, step) with a shard queued or uploading
  uint32_t shards = 0;
  uint64_t bytes = 0;
  uint64_t uploaded_shards = 0;
  uint64_t uploaded_bytes = 0;
  uint64_t failed = 0;  // failed attempts (each retried)
  std::string last_error;
  double last_upload_s = 0;  // seconds the last shard upload took
};

class Uploader {
 public:
  // Runs a kShard or kManifest task; an error re-queues it.
  using RunFn = std::function<absl::Status(const UploadTask&)>;

  // object (and intents, where a done delete's intent is forgotten, and
  // writer, which records intents, if given) must outlive the uploader.
  // A retry's back-off is timed on `clock` (null: the real one).
  Uploader(storage::Backend* object, unsigned threads, RunFn run,
           Catalog* intents = nullptr, CatalogWriter* writer = nullptr,
           const DaemonClock* clock = nullptr);
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;
  ~Uploader();  // Stop()

  void Start();
  // Stops the threads after the tasks they run; queued tasks are dropped
  // (a restarted daemon queues them again from its catalog).
  void Stop();

  void Push(UploadTask task);
  UploadBacklog Backlog() const;
  // A shard upload of `bytes` finished in `seconds` (counted in Backlog).
  void CountUploaded(uint64_t bytes, double seconds);
  // Nothing queued or running.
  bool Idle() const;
  bool WaitIdle(std::chrono::milliseconds timeout);

 private:
  void Loop();
  // The next task that is due and touches no key of an earlier queued or a
  // running task; waits (mu_ held through `lock`) when there is none.
  std::optional<UploadTask> TakeLocked(std::unique_lock<std::mutex>& lock);
  void Finish(const UploadTask& task, absl::Status status);
  absl::Status RunDelete(UploadTask& task);

  storage::Backend* const object_;
  const unsigned threads_;
  const RunFn run_;
  Catalog* const intents_;
  CatalogWriter* const writer_;
  const DaemonClock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<UploadTask> tasks_;  // by seq
  uint64_t next_seq_ = 1;
  std::multiset<std::string> running_keys_;  // of the tasks running now
  unsigned busy_ = 0;
  bool stopping_ = false;
  // kShard tasks queued or running, by (job, step): the backlog.
  std::map<std::pair<std::string, uint64_t>, std::pair<uint32_t, uint64_t>>
      pending_;
  uint64_t uploaded_shards_ = 0;
  uint64_t uploaded_bytes_ = 0;
  uint64_t failed_ = 0;
  std::string last_error_;
  double last_upload_s_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PIPELINE_UPLOADER_H_
