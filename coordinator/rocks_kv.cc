#include "coordinator/rocks_kv.h"

#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "util/rocks.h"
#include "util/status.h"

namespace ckpt::coordinator {
namespace {

constexpr std::string_view kStore = "coordinator state";

class RocksKv final : public KvBackend {
 public:
  RocksKv(std::unique_ptr<rocksdb::DB> db, std::string dir)
      : db_(std::move(db)), dir_(std::move(dir)) {}

  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
    if (s.IsNotFound()) return std::nullopt;
    if (!s.ok()) return FromRocks(s, kStore, "get " + key);
    return value;
  }

  absl::Status Scan(
      const std::string& prefix,
      const std::function<absl::Status(const std::string&, const std::string&)>&
          visit) override {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
         it->Next()) {
      absl::Status s = visit(it->key().ToString(), it->value().ToString());
      if (!s.ok()) return s;
    }
    return FromRocks(it->status(), kStore, "scan " + prefix);
  }

  absl::Status Write(const KvBatch& batch) override {
    return WriteGroup({&batch});
  }

  // One RocksDB WriteBatch for the whole group, one synced write.
  absl::Status WriteGroup(const std::vector<const KvBatch*>& batches) override {
    rocksdb::WriteBatch wb;
    for (const KvBatch* batch : batches) {
      for (const KvOp& op : *batch) {
        rocksdb::Status s =
            op.is_delete ? wb.Delete(op.key) : wb.Put(op.key, op.value);
        if (!s.ok()) return FromRocks(s, kStore, "batch " + op.key);
      }
    }
    if (wb.Count() == 0) return absl::OkStatus();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Write(wo, &wb), kStore, "write to " + dir_);
  }

  std::string Describe() const override { return "RocksDB " + dir_; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  const std::string dir_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvBackend>> OpenRocksKv(const std::string& dir) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db,
                        OpenRocksDb(dir, kStore));
  return std::unique_ptr<KvBackend>(new RocksKv(std::move(db), dir));
}

}  // namespace ckpt::coordinator
