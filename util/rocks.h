// RocksDB for the tree's durable stores (the coordinator's state, the
// daemon's catalog): one way to open a database and one conversion of
// rocksdb::Status. Linked only by the targets that use RocksDB
// (ckpt_rocks); rocksdb headers stay out of this one. Functions only;
// thread-safe.
#ifndef CKPT_UTIL_ROCKS_H_
#define CKPT_UTIL_ROCKS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rocksdb {
class DB;
class Status;
}  // namespace rocksdb

namespace ckpt {

// OK, NotFound as NotFound, anything else Internal; the message is
// "<store>: <what>: <rocksdb's message>".
[[nodiscard]] absl::Status FromRocks(const rocksdb::Status& s,
                                     std::string_view store,
                                     std::string_view what);

// Opens (creating if missing) the database in dir with the tree's options:
// small stores, one background job, two info logs kept. `store` names it
// in errors ("catalog", "coordinator state").
[[nodiscard]] absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenRocksDb(
    const std::string& dir, std::string_view store);

}  // namespace ckpt

#endif  // CKPT_UTIL_ROCKS_H_
