#include "coordinator/store.h"

#include <cinttypes>
#include <cstdio>

#include "coordinator/rocks_kv.h"
#include "util/status.h"

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
std::string ManifestKey(const std::string& job, uint64_t step) {
  return "G/" + job + "/" + Num20(step);
}
std::string OrderKey(uint64_t id) { return "O/" + Num20(id); }
std::string EventKey(uint64_t seq) { return "E/" + Num20(seq); }
std::string StacksPrefix(const std::string& job) { return "K/" + job + "/"; }
std::string StacksKey(const std::string& job, uint64_t generation,
                      const std::string& node) {
  return StacksPrefix(job) + Num20(generation) + "/" + node;
}

template <typename Record>
absl::Status ScanPrefix(KvBackend* kv, const std::string& prefix,
                        std::vector<Record>* out) {
  return kv->Scan(prefix,
                  [out](const std::string& key, const std::string& value) {
                    Record r;
                    if (!r.ParseFromString(value))
                      return absl::DataLossError("coordinator state: record " +
                                                 key + " does not parse");
                    out->push_back(std::move(r));
                    return absl::OkStatus();
                  });
}

KvOp Put(std::string key, std::string value) {
  return KvOp{false, std::move(key), std::move(value)};
}
KvOp Delete(std::string key) { return KvOp{true, std::move(key), ""}; }

}  // namespace

CoordStore::CoordStore(std::unique_ptr<KvBackend> kv) : kv_(std::move(kv)) {}

CoordStore::Batch::Batch() = default;
CoordStore::Batch::~Batch() = default;
bool CoordStore::Batch::empty() const { return ops_.empty(); }

void CoordStore::Batch::PutNode(const v1::NodeRecord& n) {
  v1::NodeRecord copy = n;
  copy.set_ms_since_heartbeat(0);  // volatile; never persisted
  ops_.push_back(Put(NodeKey(n.node_id()), copy.SerializeAsString()));
}
void CoordStore::Batch::PutJob(const v1::JobRecord& j) {
  ops_.push_back(Put(JobKey(j.job()), j.SerializeAsString()));
}
void CoordStore::Batch::PutShard(const v1::ShardRecord& s) {
  ops_.push_back(
      Put(ShardKey(s.job(), s.step(), s.rank()), s.SerializeAsString()));
}
void CoordStore::Batch::DeleteShard(const std::string& job, uint64_t step,
                                    uint32_t rank) {
  ops_.push_back(Delete(ShardKey(job, step, rank)));
}
void CoordStore::Batch::PutOrder(const v1::Order& o) {
  ops_.push_back(Put(OrderKey(o.id()), o.SerializeAsString()));
}
void CoordStore::Batch::DeleteOrder(uint64_t id) {
  ops_.push_back(Delete(OrderKey(id)));
}
void CoordStore::Batch::PutEvent(const v1::Event& e) {
  ops_.push_back(Put(EventKey(e.seq()), e.SerializeAsString()));
}
void CoordStore::Batch::DeleteEvent(uint64_t seq) {
  ops_.push_back(Delete(EventKey(seq)));
}
void CoordStore::Batch::PutStacks(const v1::StackReport& r) {
  ops_.push_back(Put(StacksKey(r.job(), r.generation(), r.node_id()),
                     r.SerializeAsString()));
}
void CoordStore::Batch::DeleteStacks(const std::string& job,
                                     uint64_t generation,
                                     const std::string& node) {
  ops_.push_back(Delete(StacksKey(job, generation, node)));
}
void CoordStore::Batch::PutCounters(const v1::Counters& c) {
  ops_.push_back(Put("C", c.SerializeAsString()));
}
void CoordStore::Batch::PutManifest(const storage::v1::GlobalManifest& m) {
  ops_.push_back(Put(ManifestKey(m.job(), m.step()), m.SerializeAsString()));
}
void CoordStore::Batch::DeleteManifest(const std::string& job, uint64_t step) {
  ops_.push_back(Delete(ManifestKey(job, step)));
}

absl::StatusOr<std::unique_ptr<CoordStore>> CoordStore::Open(
    const std::string& dir) {
  absl::StatusOr<std::unique_ptr<KvBackend>> kv = OpenRocksKv(dir);
  if (!kv.ok()) return kv.status();
  return std::make_unique<CoordStore>(std::move(*kv));
}

CoordStore::~CoordStore() = default;

absl::StatusOr<std::vector<v1::StackReport>> CoordStore::LoadStacks(
    const std::string& job) {
  std::vector<v1::StackReport> out;
  CKPT_RETURN_IF_ERROR(ScanPrefix(kv_.get(), StacksPrefix(job), &out));
  return out;
}

absl::StatusOr<CoordStore::Snapshot> CoordStore::Load() {
  Snapshot snap;
  absl::Status s = ScanPrefix(kv_.get(), "N/", &snap.nodes);
  if (s.ok()) s = ScanPrefix(kv_.get(), "J/", &snap.jobs);
  if (s.ok()) s = ScanPrefix(kv_.get(), "S/", &snap.shards);
  if (s.ok()) s = ScanPrefix(kv_.get(), "O/", &snap.orders);
  if (s.ok()) s = ScanPrefix(kv_.get(), "E/", &snap.events);
  if (s.ok()) s = ScanPrefix(kv_.get(), "G/", &snap.manifests);
  if (!s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> counters = kv_->Get("C");
  if (!counters.ok()) return counters.status();
  if (counters->has_value() && !snap.counters.ParseFromString(**counters))
    return absl::DataLossError("coordinator state: record C does not parse");
  return snap;
}

absl::Status CoordStore::Commit(Batch* batch) {
  if (batch->empty()) return absl::OkStatus();
  absl::Status s = kv_->Write(batch->ops_);
  batch->ops_.clear();
  return s;
}

absl::Status CoordStore::CommitGroup(const std::vector<Batch*>& batches) {
  std::vector<const KvBatch*> todo;
  for (Batch* b : batches)
    if (!b->empty()) todo.push_back(&b->ops_);
  absl::Status s = todo.empty() ? absl::OkStatus() : kv_->WriteGroup(todo);
  for (Batch* b : batches) b->ops_.clear();
  return s;
}

}  // namespace ckpt::coordinator
