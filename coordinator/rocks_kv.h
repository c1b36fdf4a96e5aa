// RocksKv: KvBackend on a RocksDB directory on this machine (the
// coordinator's embedded default, --state DIR). Each Write is one RocksDB
// WriteBatch with a synced write-ahead log; a group
// (WriteGroup) is one WriteBatch too: one sync for all. Thread-safe (RocksDB
// is).
#ifndef CKPT_COORDINATOR_ROCKS_KV_H_
#define CKPT_COORDINATOR_ROCKS_KV_H_

#include <memory>
#include <string>

#include "coordinator/kv_backend.h"

namespace ckpt::coordinator {

// Opens (creating if missing) the RocksDB database in `dir`.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvBackend>> OpenRocksKv(
    const std::string& dir);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_ROCKS_KV_H_
