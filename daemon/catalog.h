// The daemon's catalog: a RocksDB database under <root>/.catalog that
// records every job (owner uid, world size, arena dimensions) and every
// shard that was committed (staged in a slot, durable on disk, or failed),
// with its tensor index and checksums. It is what a restarted daemon
// recovers from. Thread-safe (RocksDB is).
#ifndef CKPT_DAEMON_CATALOG_H_
#define CKPT_DAEMON_CATALOG_H_

#include <memory>
#include <string>
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

 private:
  explicit Catalog(rocksdb::DB* db);  // takes ownership
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CATALOG_H_
