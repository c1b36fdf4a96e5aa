// The daemon's catalog: a RocksDB database under <root>/.catalog that
// records every job (owner uid, world size, arena dimensions) and every
// shard that was committed (staged in a slot, durable on disk, or failed),
// with its tensor index and checksums, and the deletes the daemon still
// owes storage. It is what a restarted daemon recovers from. Thread-safe
// (RocksDB is).
#ifndef CKPT_DAEMON_CATALOG_H_
#define CKPT_DAEMON_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt.pb.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace ckpt::daemon {

class Catalog {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Catalog>> Open(
      const std::string& dir);
  ~Catalog();

  [[nodiscard]] absl::Status PutJob(const v1::JobRecord& job);
  absl::Status DeleteJob(const std::string& job);
  [[nodiscard]] absl::StatusOr<std::vector<v1::JobRecord>> Jobs();

  // sync: wait for the write-ahead log to reach the disk (durable records).
  [[nodiscard]] absl::Status PutShard(const v1::ShardRecord& shard, bool sync);
  absl::Status DeleteShard(const std::string& job, uint64_t step, uint32_t rank);
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardRecord>> Shards(
      const std::string& job);

  // Deletes the daemon owes storage, by id (> 0): put before the records
  // that made them due are deleted (the log keeps the order), forgotten
  // (synced: a stale one could delete a key written again) once done.
  [[nodiscard]] absl::StatusOr<uint64_t> PutDeleteIntent(
      const v1::DeleteIntent& intent);
  absl::Status ForgetDeleteIntent(uint64_t id);
  // Oldest first.
  [[nodiscard]] absl::StatusOr<
      std::vector<std::pair<uint64_t, v1::DeleteIntent>>>
  DeleteIntents();

 private:
  explicit Catalog(rocksdb::DB* db);  // takes ownership
  std::unique_ptr<rocksdb::DB> db_;
  std::atomic<uint64_t> next_intent_{1};
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CATALOG_H_
