#include "coordinator/rocks_kv.h"

#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace ckpt::coordinator {
namespace {

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError("coordinator state: " + what + ": " +
                             s.ToString());
}

class RocksKv final : public KvBackend {
 public:
  RocksKv(rocksdb::DB* db, std::string dir) : db_(db), dir_(std::move(dir)) {}

  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
    if (s.IsNotFound()) return std::nullopt;
    if (!s.ok()) return FromRocks(s, "get " + key);
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
    return FromRocks(it->status(), "scan " + prefix);
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
        if (!s.ok()) return FromRocks(s, "batch " + op.key);
      }
    }
    if (wb.Count() == 0) return absl::OkStatus();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Write(wo, &wb), "write to " + dir_);
  }

  std::string Describe() const override { return "RocksDB " + dir_; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  const std::string dir_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvBackend>> OpenRocksKv(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_background_jobs = 1;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) return FromRocks(s, "open " + dir);
  return std::unique_ptr<KvBackend>(new RocksKv(db, dir));
}

}  // namespace ckpt::coordinator
