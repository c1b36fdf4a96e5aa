#include "coordinator/store.h"

#include <cinttypes>
#include <cstdio>

#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace ckpt::coordinator {
namespace {

std::string Num20(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020" PRIu64, v);
  return buf;
}
std::string NodeKey(const std::string& node) { return "N/" + node; }
std::string JobKey(const std::string& job) { return "J/" + job; }
std::string ShardKey(const std::string& job, uint64_t step, uint32_t rank) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05u", rank);
  return "S/" + job + "/" + Num20(step) + "/" + buf;
}
std::string OrderKey(uint64_t id) { return "O/" + Num20(id); }
std::string EventKey(uint64_t seq) { return "E/" + Num20(seq); }

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError("coordinator state: " + what + ": " + s.ToString());
}

template <typename Record>
absl::Status ScanPrefix(rocksdb::DB* db, const std::string& prefix, std::vector<Record>* out) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    Record r;
    if (!r.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())))
      return absl::DataLossError("coordinator state: record " + it->key().ToString() +
                                 " does not parse");
    out->push_back(std::move(r));
  }
  return FromRocks(it->status(), "scan " + prefix);
}

}  // namespace

CoordStore::CoordStore(rocksdb::DB* db, std::string dir) : db_(db), dir_(std::move(dir)) {}

CoordStore::Batch::Batch() : batch_(std::make_unique<rocksdb::WriteBatch>()) {}
CoordStore::Batch::~Batch() = default;
bool CoordStore::Batch::empty() const { return batch_->Count() == 0; }

void CoordStore::Batch::PutNode(const v1::NodeRecord& n) {
  v1::NodeRecord copy = n;
  copy.set_ms_since_heartbeat(0);  // volatile; never persisted
  batch_->Put(NodeKey(n.node_id()), copy.SerializeAsString());
}
void CoordStore::Batch::PutJob(const v1::JobRecord& j) {
  batch_->Put(JobKey(j.job()), j.SerializeAsString());
}
void CoordStore::Batch::PutShard(const v1::ShardRecord& s) {
  batch_->Put(ShardKey(s.job(), s.step(), s.rank()), s.SerializeAsString());
}
void CoordStore::Batch::DeleteShard(const std::string& job, uint64_t step, uint32_t rank) {
  batch_->Delete(ShardKey(job, step, rank));
}
void CoordStore::Batch::PutOrder(const v1::Order& o) {
  batch_->Put(OrderKey(o.id()), o.SerializeAsString());
}
void CoordStore::Batch::DeleteOrder(uint64_t id) { batch_->Delete(OrderKey(id)); }
void CoordStore::Batch::PutEvent(const v1::Event& e) {
  batch_->Put(EventKey(e.seq()), e.SerializeAsString());
}
void CoordStore::Batch::DeleteEvent(uint64_t seq) { batch_->Delete(EventKey(seq)); }
void CoordStore::Batch::PutCounters(const v1::Counters& c) { batch_->Put("C", c.SerializeAsString()); }

absl::StatusOr<std::unique_ptr<CoordStore>> CoordStore::Open(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_background_jobs = 1;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) return FromRocks(s, "open " + dir);
  return std::unique_ptr<CoordStore>(new CoordStore(db, dir));
}

CoordStore::~CoordStore() = default;

absl::StatusOr<CoordStore::Snapshot> CoordStore::Load() {
  Snapshot snap;
  absl::Status s = ScanPrefix(db_.get(), "N/", &snap.nodes);
  if (s.ok()) s = ScanPrefix(db_.get(), "J/", &snap.jobs);
  if (s.ok()) s = ScanPrefix(db_.get(), "S/", &snap.shards);
  if (s.ok()) s = ScanPrefix(db_.get(), "O/", &snap.orders);
  if (s.ok()) s = ScanPrefix(db_.get(), "E/", &snap.events);
  if (!s.ok()) return s;
  std::string counters;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), "C", &counters);
  if (rs.ok()) {
    if (!snap.counters.ParseFromString(counters))
      return absl::DataLossError("coordinator state: record C does not parse");
  } else if (!rs.IsNotFound()) {
    return FromRocks(rs, "get C");
  }
  return snap;
}

absl::Status CoordStore::Commit(Batch* batch) {
  if (batch->empty()) return absl::OkStatus();
  rocksdb::WriteOptions wo;
  wo.sync = true;
  absl::Status s = FromRocks(db_->Write(wo, batch->batch_.get()), "write to " + dir_);
  batch->batch_->Clear();
  return s;
}

}  // namespace ckpt::coordinator
