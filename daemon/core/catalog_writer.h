// CatalogWriter: applies the engine's catalog edits (catalog.h) in the
// order they were queued, outside the engine's state lock, as many at a
// time as are waiting: one RocksDB batch, synced when any edit of the group
// asks for it (group commit, as coordinator/group_commit.h does for the
// coordinator, and as leveldb's LogAndApply unlocks for its MANIFEST write).
//
// The engine queues an edit under its state lock, in the same critical
// section as the memory change it records, so the order of edits is the
// order of the changes; a later edit of the same key therefore always
// lands after an earlier one. Whoever needs an edit's outcome (a commit
// that must refuse when its record cannot be written, a delete that must
// not run before its intent is recorded) waits for it after releasing the
// state lock. A waiter whose edit is not yet being written writes the
// group itself; a background thread writes the edits nobody waits for.
//
// A group whose batch fails is written again one edit at a time, so that
// one edit that cannot be written fails alone. Wait never answers OK for
// an edit that failed: failures are remembered as runs of consecutive
// tickets (a full disk fails a whole group alike, so a run costs one
// entry however many edits it holds); past kMaxFailedRuns the oldest runs
// are forgotten, and a ticket at or below them is then answered with an
// error, since its outcome is no longer known. The destructor writes what
// is queued, then stops. Thread-safe; its mutex is never held across a
// write, and the engine's state lock may be held by callers of Enqueue.
#ifndef CKPT_DAEMON_CORE_CATALOG_WRITER_H_
#define CKPT_DAEMON_CORE_CATALOG_WRITER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "daemon/core/catalog.h"

namespace ckpt::daemon {

class CatalogWriter {
 public:
  // catalog must outlive the writer.
  explicit CatalogWriter(Catalog* catalog);
  CatalogWriter(const CatalogWriter&) = delete;
  CatalogWriter& operator=(const CatalogWriter&) = delete;
  ~CatalogWriter();

  // Queues `edit` (an empty one too); `sync` makes its group wait for the
  // write-ahead log to reach the disk. Returns its ticket (> 0).
  uint64_t Enqueue(CatalogEdit edit, bool sync);
  // Until edit `ticket` and every earlier one are written; its outcome
  // (an error, never OK, when it failed or its outcome was forgotten).
  [[nodiscard]] absl::Status Wait(uint64_t ticket);
  // Until every edit queued so far is written.
  void Flush();
  // Groups written so far (each one RocksDB write).
  uint64_t groups_written() const;

 private:
  struct Queued {
    uint64_t ticket;
    CatalogEdit edit;
    bool sync;
  };
  // Takes the queued edits and writes them (mu_ released meanwhile).
  void WriteGroupLocked(std::unique_lock<std::mutex>& lock);
  void Loop();

  Catalog* const catalog_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  uint64_t next_ticket_ = 1;
  uint64_t done_ = 0;  // every ticket <= done_ is written (or failed)
  bool writing_ = false;
  bool stopping_ = false;
  uint64_t groups_ = 0;
  static constexpr size_t kMaxFailedRuns = 1024;
  // Consecutive failed tickets with the same error code, by first ticket:
  // the last ticket of the run and the first failure's status.
  struct FailedRun {
    uint64_t last;
    absl::Status status;
  };
  // Records ticket's failure (tickets in increasing order).
  void RecordFailureLocked(uint64_t ticket, absl::Status status);
  std::map<uint64_t, FailedRun> failed_;
  // Failures of tickets <= forgotten_ may have been dropped (past
  // kMaxFailedRuns): such a ticket's outcome is unknown.
  uint64_t forgotten_ = 0;
  absl::Status forgotten_status_;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_CATALOG_WRITER_H_
