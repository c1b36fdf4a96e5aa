// CoordStore: the coordinator's durable state in RocksDB under --state DIR.
// Records are the protos of coordinator.proto, one key each:
//   "N/<node>"                 NodeRecord
//   "J/<job>"                  JobRecord
//   "S/<job>/<step:20>/<rank>" ShardRecord
//   "O/<order id:20>"          Order (pending, not yet acknowledged)
//   "E/<seq:20>"               Event
//   "C"                        Counters
// Every change of one coordinator operation goes into one Batch, committed
// atomically with a synced write-ahead log, so a coordinator killed at any
// point restarts with either all or none of an operation's effects.
// Thread-safe (RocksDB is); a Batch is used by one thread.
#ifndef CKPT_COORDINATOR_STORE_H_
#define CKPT_COORDINATOR_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator.pb.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

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
    bool empty() const;

   private:
    friend class CoordStore;
    std::unique_ptr<rocksdb::WriteBatch> batch_;  // RocksDB stays out of this header
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordStore>> Open(
      const std::string& dir);
  ~CoordStore();

  // Every record; DataLoss naming the key if one does not parse.
  [[nodiscard]] absl::StatusOr<Snapshot> Load();
  // Applies the batch atomically, durable on return.
  [[nodiscard]] absl::Status Commit(Batch* batch);

 private:
  CoordStore(rocksdb::DB* db, std::string dir);  // takes ownership of db
  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_STORE_H_
