// CoordStore: the coordinator's durable state, typed, on a KvBackend
// (kv_backend.h: RocksDB under --state DIR, or etcd under --state etcd://).
// Records are the protos of coordinator.proto, one key each:
//   "N/<node>"                 NodeRecord
//   "J/<job>"                  JobRecord
//   "S/<job>/<step:20>/<rank>" ShardRecord
//   "O/<order id:20>"          Order (pending, not yet acknowledged)
//   "E/<seq:20>"               Event
//   "C"                        Counters
//   "G/<job>/<step:20>"        storage GlobalManifest: the committed write
//                              of a recent good step's MANIFEST.global
//                              (what Open puts back over another write)
//   "K/<job>/<gen:20>/<node>"  StackReport (a hang's evidence; not part of
//                              the Snapshot, read by LoadStacks)
// Every change of one coordinator operation goes into one Batch, committed
// atomically and durably by the backend, so a coordinator killed at any
// point restarts with either all or none of an operation's effects. Shard
// records ("S/") are no longer written (reports are soft state, see
// coordinator.h); old ones are still read and dropped.
// Thread-safe (the backend is); a Batch is used by one thread.
#ifndef CKPT_COORDINATOR_STORE_H_
#define CKPT_COORDINATOR_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator.pb.h"
#include "coordinator/kv_backend.h"
#include "manifest.pb.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

class CoordStore {
 public:
  struct Snapshot {
    std::vector<v1::NodeRecord> nodes;
    std::vector<v1::JobRecord> jobs;
    std::vector<v1::ShardRecord> shards;  // in (job, step, rank) order
    std::vector<v1::Order> orders;        // in id order
    std::vector<v1::Event> events;        // in seq order
    v1::Counters counters;
    std::vector<storage::v1::GlobalManifest> manifests;  // kept ("G/")
  };

  class Batch {
   public:
    Batch();
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    void PutNode(const v1::NodeRecord& n);
    void PutJob(const v1::JobRecord& j);
    void PutShard(const v1::ShardRecord& s);
    void DeleteShard(const std::string& job, uint64_t step, uint32_t rank);
    void PutOrder(const v1::Order& o);
    void DeleteOrder(uint64_t id);
    void PutEvent(const v1::Event& e);
    void DeleteEvent(uint64_t seq);
    void PutCounters(const v1::Counters& c);
    void PutManifest(const storage::v1::GlobalManifest& m);
    void DeleteManifest(const std::string& job, uint64_t step);
    void PutStacks(const v1::StackReport& r);
    void DeleteStacks(const std::string& job, uint64_t generation,
                      const std::string& node);
    bool empty() const;

   private:
    friend class CoordStore;
    KvBatch ops_;
  };

  // RocksDB in `dir` (created if missing).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordStore>> Open(
      const std::string& dir);
  // On any backend (etcd/etcd_kv.h).
  explicit CoordStore(std::unique_ptr<KvBackend> kv);
  ~CoordStore();

  // Every record; DataLoss naming the key if one does not parse.
  [[nodiscard]] absl::StatusOr<Snapshot> Load();
  // Every StackReport kept for `job`, in (generation, node) order.
  [[nodiscard]] absl::StatusOr<std::vector<v1::StackReport>> LoadStacks(
      const std::string& job);
  // Applies the batch atomically, durable on return.
  [[nodiscard]] absl::Status Commit(Batch* batch);
  // Applies the batches in order, each atomically, with one sync for all
  // (group commit): durable on return. On an error the batches before the
  // failing one may or may not be durable; none was acknowledged.
  [[nodiscard]] absl::Status CommitGroup(const std::vector<Batch*>& batches);

 private:
  const std::unique_ptr<KvBackend> kv_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_STORE_H_
