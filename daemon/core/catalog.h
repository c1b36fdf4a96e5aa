// The daemon's catalog: a RocksDB database under <root>/.catalog that
// records every job (owner uid, world size, arena dimensions) and every
// shard that was committed (staged in a slot, durable on disk, or failed),
// with its tensor index and checksums, and the deletes the daemon still
// owes storage. It is what a restarted daemon recovers from. Thread-safe
// (RocksDB is).
#ifndef CKPT_DAEMON_CORE_CATALOG_H_
#define CKPT_DAEMON_CORE_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "catalog.pb.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace ckpt::daemon {

// The catalog's records (proto/catalog.proto).
namespace catv1 = ::ckpt::catalog::v1;

class Catalog;

// Catalog writes gathered while the engine decides a change, and applied
// by Catalog::Apply as one atomic batch: either every one of them lands or
// none does, so a caller that applies the edit before it changes its
// memory leaves everything as it was when the write fails. Plain data.
class CatalogEdit {
 public:
  void PutJob(const catv1::JobRecord& job);
  void PutShard(const catv1::ShardRecord& shard);
  void DeleteShard(const std::string& job, uint64_t step, uint32_t rank);
  // The job's record and every shard record of it.
  void DeleteJob(const std::string& job);
  // `id` comes from Catalog::NewIntentId.
  void PutDeleteIntent(uint64_t id, const catv1::DeleteIntent& intent);
  void ForgetDeleteIntent(uint64_t id);
  // Appends `other`'s writes after these.
  void Append(CatalogEdit other) {
    for (Op& op : other.ops_) ops_.push_back(std::move(op));
  }
  bool empty() const { return ops_.empty(); }
  // The same writes in the same order (tests).
  friend bool operator==(const CatalogEdit&, const CatalogEdit&) = default;

 private:
  friend class Catalog;
  enum class Kind { kJob, kShard, kOther };
  struct Op {
    Kind kind;
    std::string key;
    std::optional<std::string> value;  // nullopt: delete the key
    bool range = false;                // delete [key, key + "\xff")
    friend bool operator==(const Op&, const Op&) = default;
  };
  std::vector<Op> ops_;
};

class Catalog {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Catalog>> Open(
      const std::string& dir);
  ~Catalog();

  [[nodiscard]] absl::Status PutJob(const catv1::JobRecord& job);
  absl::Status DeleteJob(const std::string& job);
  [[nodiscard]] absl::StatusOr<std::vector<catv1::JobRecord>> Jobs();

  // sync: wait for the write-ahead log to reach the disk (durable records).
  [[nodiscard]] absl::Status PutShard(const catv1::ShardRecord& shard,
                                      bool sync);
  absl::Status DeleteShard(const std::string& job, uint64_t step,
                           uint32_t rank);
  [[nodiscard]] absl::StatusOr<std::vector<catv1::ShardRecord>> Shards(
      const std::string& job);

  // Deletes the daemon owes storage, by id (> 0): put before the records
  // that made them due are deleted (the log keeps the order), forgotten
  // (synced: a stale one could delete a key written again) once done.
  [[nodiscard]] absl::StatusOr<uint64_t> PutDeleteIntent(
      const catv1::DeleteIntent& intent);
  absl::Status ForgetDeleteIntent(uint64_t id);
  // Oldest first.
  [[nodiscard]] absl::StatusOr<
      std::vector<std::pair<uint64_t, catv1::DeleteIntent>>>
  DeleteIntents();

  // A fresh id for a delete intent put through a CatalogEdit.
  uint64_t NewIntentId() { return next_intent_.fetch_add(1); }
  // Writes the edit's records in one batch, in order; `sync` waits for the
  // write-ahead log to reach the disk. On an error nothing was written.
  [[nodiscard]] absl::Status Apply(const CatalogEdit& edit, bool sync);
  // The same for several edits, in order, as one batch (CatalogWriter's
  // group commit).
  [[nodiscard]] absl::Status ApplyGroup(
      std::span<const CatalogEdit* const> edits, bool sync);

  // Tests: every later write that puts a shard (`shards`) or a job (`jobs`)
  // record fails as on a full disk, and changes nothing.
  void FailPutsForTesting(bool shards, bool jobs) {
    fail_shard_puts_ = shards;
    fail_job_puts_ = jobs;
  }
  // Tests: called before every write with whether it is synced (a test
  // holds or counts writes there); set it before the engine starts, clear
  // it after it stopped.
  void SetBeforeWriteForTesting(std::function<void(bool sync)> hook) {
    before_write_ = std::move(hook);
  }

 private:
  explicit Catalog(rocksdb::DB* db);  // takes ownership
  std::unique_ptr<rocksdb::DB> db_;
  std::atomic<uint64_t> next_intent_{1};
  std::atomic<bool> fail_shard_puts_{false};
  std::atomic<bool> fail_job_puts_{false};
  std::function<void(bool sync)> before_write_;
  void BeforeWrite(bool sync) const {
    if (before_write_) before_write_(sync);
  }
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_CATALOG_H_
