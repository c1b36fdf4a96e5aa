// KvBackend: the ordered key-value store under CoordStore (store.h). Keys are
// byte strings in lexicographic order; values are serialized records. Two
// implementations: RocksKv (rocks_kv.h, the embedded default: a RocksDB
// directory on this machine) and EtcdKv (etcd/etcd_kv.h, --state etcd://...:
// an etcd cluster, every write fenced by the writer's leadership).
//
// Contract: Write applies every operation of a batch or none, and is durable
// when it returns OK. A backend that fences (EtcdKv) refuses a write with
// UNAVAILABLE "not leader: ..." once its writer is no longer the leader (so
// that a client goes to another replica); such a refusal changes nothing.
// Scan visits the keys under a prefix in key order.
// Thread-safety: every method may be called concurrently; a KvBatch is used by
// one thread.
#ifndef CKPT_COORDINATOR_KV_BACKEND_H_
#define CKPT_COORDINATOR_KV_BACKEND_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::coordinator {

struct KvOp {
  bool is_delete = false;
  std::string key;
  std::string value;  // empty for a delete
};
using KvBatch = std::vector<KvOp>;

class KvBackend {
 public:
  virtual ~KvBackend() = default;

  // The value of `key`, or nullopt when there is none.
  [[nodiscard]] virtual absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) = 0;
  // Calls visit(key, value) for each key starting with `prefix`, in key
  // order; stops at the first error visit returns and returns it.
  [[nodiscard]] virtual absl::Status Scan(
      const std::string& prefix,
      const std::function<absl::Status(const std::string&, const std::string&)>&
          visit) = 0;
  // Applies the batch atomically; durable on OK.
  [[nodiscard]] virtual absl::Status Write(const KvBatch& batch) = 0;
  // Applies the batches in order (group commit), each atomically (several
  // may be applied as one), durable on OK. On an error a prefix of the
  // batches may have been applied; a fencing backend fences every write.
  [[nodiscard]] virtual absl::Status WriteGroup(
      const std::vector<const KvBatch*>& batches) = 0;
  // Where the state lives, for messages ("RocksDB DIR", "etcd PREFIX").
  virtual std::string Describe() const = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_KV_BACKEND_H_
