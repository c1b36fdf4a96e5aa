// Persister: the queue of storage work the engine hands off — write a
// staged shard to storage, write this node's manifest of a step, delete a
// file (or a step's prefix) — and the one thread that runs it, in order,
// each task once its not_before time has come (retries are re-queued with a
// later one).
//
// The persister owns the queue and its thread; it deletes files itself and
// hands shard and manifest tasks to the `run` callback of its owner, the
// PersistPipeline (pipeline.h), which does their I/O without the engine
// mutex.
//
// Thread-safety: every method is safe from any thread. The queue has its
// own lock, taken only for queue work and never held while a task runs,
// so a caller may queue with the job table's lock held (that order, table
// then queue, is the only one: the persister never takes the table's lock,
// and its tasks run with no lock of the persister held). progress() and
// running() are lock-free, for the service watchdog: they must answer even
// while the thread (or whoever holds a lock) is wedged.
#ifndef CKPT_DAEMON_PIPELINE_PERSISTER_H_
#define CKPT_DAEMON_PIPELINE_PERSISTER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/clock.h"
#include "storage/backend.h"

namespace ckpt::daemon {

struct PersistTask {
  // kDelete removes `key` (a prefix when `prefix`), outside the mutex: an
  // unlink of a large file must not stall saves and restores.
  enum Kind { kShard, kManifest, kDelete } kind = kShard;
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint64_t gen = 0;  // kShard: the generation of the shard to write
  std::chrono::steady_clock::time_point not_before{};
  std::string key{};  // {}: aggregate inits may leave it out without a warning
  bool prefix = false;
  uint64_t intent = 0;  // kDelete: its record in the catalog (0: none)
  // kDelete: the catalog edit that records the intent (CatalogWriter
  // ticket, 0: none); the delete waits until it is written.
  uint64_t ticket = 0;
};

class Persister {
 public:
  // Runs a kShard or kManifest task (the pipeline, its owner); called with
  // no lock of the persister held.
  using RunFn = std::function<void(const PersistTask&)>;

  // backend (and intents, where a done delete's intent is forgotten, and
  // writer, which records intents, if given) must outlive the persister.
  // A task's not_before is read on `clock` (null: the real one).
  Persister(storage::Backend* backend, RunFn run, Catalog* intents = nullptr,
            CatalogWriter* writer = nullptr,
            const DaemonClock* clock = nullptr);
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;
  ~Persister();  // Stop()

  // Starts the thread (after recovery has queued its tasks).
  void Start();
  // Stops the thread after the task it is running; queued tasks stay.
  void Stop();

  void Push(PersistTask task);
  // A delete, and its DeleteIntent in the catalog (0: none), recorded by
  // the writer's edit `ticket` (0: already written): the delete runs once
  // that edit is written, and the intent is forgotten once it is done; a
  // failure leaves it for the next start.
  void QueueDelete(std::string key, bool prefix, uint64_t intent = 0,
                   uint64_t ticket = 0);
  size_t Size() const;
  // Nothing queued or running.
  bool Idle() const;
  // Waits until Idle(); false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout) const;

  // Lock-free. A counter that moves with every task done and every piece
  // of a shard written (NoteProgress); whether a task is running; how many
  // wait.
  uint64_t progress() const {
    return progress_.load(std::memory_order_relaxed);
  }
  bool running() const { return running_.load(std::memory_order_relaxed); }
  size_t queued() const { return queued_.load(std::memory_order_relaxed); }
  // Called by the running task as its write advances.
  void NoteProgress() { progress_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void Loop();

  storage::Backend* const backend_;
  const RunFn run_;
  Catalog* const intents_;
  CatalogWriter* const writer_;
  const DaemonClock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;          // a task queued, or stopping
  mutable std::condition_variable idle_cv_;  // a task done (WaitIdle)
  std::deque<PersistTask> tasks_;
  bool busy_ = false;
  bool stopping_ = false;
  std::atomic<uint64_t> progress_{0};
  std::atomic<bool> running_{false};
  std::atomic<size_t> queued_{0};
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PIPELINE_PERSISTER_H_
