#include "daemon/core/catalog.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "util/rocks.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// Keys: "J/<job>" and "S/<job>/<step:20>/<rank:5>" so that a prefix scan
// returns a job's shards in step order.
std::string JobKey(const std::string& job) { return "J/" + job; }
std::string ShardPrefix(const std::string& job) { return "S/" + job + "/"; }
std::string ShardKey(const std::string& job, uint64_t step, uint32_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%020" PRIu64 "/%05u", step, rank);
  return ShardPrefix(job) + buf;
}

// "D/<id:20>": the deletes owed, oldest first.
constexpr char kIntentPrefix[] = "D/";
std::string IntentKey(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "D/%020" PRIu64, id);
  return buf;
}

// The catalog's errors: "catalog: <what>: ..." (util/rocks.h).
absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  return ckpt::FromRocks(s, "catalog", what);
}

template <typename Record>
absl::StatusOr<std::vector<Record>> ScanPrefix(rocksdb::DB* db,
                                               const std::string& prefix) {
  std::vector<Record> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    Record r;
    if (!r.ParseFromArray(it->value().data(),
                          static_cast<int>(it->value().size())))
      return absl::DataLossError("catalog: record " + it->key().ToString() +
                                 " does not parse");
    out.push_back(std::move(r));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan " + prefix);
  return out;
}

// Creates `dir` if missing, and closes it to everyone but its owner (the
// catalog names every job, its uid and its files): one created by RocksDB
// or an older daemon was world-readable.
absl::Status MakePrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return ErrnoToStatus(errno, "catalog: mkdir " + dir);
  const int fd =
      ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "catalog: open " + dir);
  struct stat st {};
  absl::Status s;
  if (::fstat(fd, &st) != 0)
    s = ErrnoToStatus(errno, "catalog: fstat " + dir);
  else if ((st.st_mode & 07777) != 0700 && ::fchmod(fd, 0700) != 0)
    s = ErrnoToStatus(errno, "catalog: chmod 0700 " + dir);
  ::close(fd);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& dir) {
  CKPT_RETURN_IF_ERROR(MakePrivateDir(dir));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db,
                        OpenRocksDb(dir, "catalog"));
  std::unique_ptr<Catalog> catalog(new Catalog(db.release()));
  auto intents = catalog->DeleteIntents();
  if (!intents.ok()) return intents.status();
  if (!intents->empty()) catalog->next_intent_ = intents->back().first + 1;
  return catalog;
}

Catalog::Catalog(rocksdb::DB* db) : db_(db) {}
Catalog::~Catalog() = default;

absl::Status Catalog::PutJob(const catv1::JobRecord& job) {
  if (fail_job_puts_)
    return absl::ResourceExhaustedError("put job " + job.job() +
                                        ": no space (injected)");
  BeforeWrite(true);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Put(wo, JobKey(job.job()), job.SerializeAsString()),
                   "put job " + job.job());
}

absl::Status Catalog::DeleteJob(const std::string& job) {
  BeforeWrite(true);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  rocksdb::Status s =
      db_->DeleteRange(wo, db_->DefaultColumnFamily(), ShardPrefix(job),
                       ShardPrefix(job) + "\xff");
  if (s.ok()) s = db_->Delete(wo, JobKey(job));
  return FromRocks(s, "delete job " + job);
}

absl::StatusOr<std::vector<catv1::JobRecord>> Catalog::Jobs() {
  return ScanPrefix<catv1::JobRecord>(db_.get(), "J/");
}

absl::Status Catalog::PutShard(const catv1::ShardRecord& shard, bool sync) {
  if (fail_shard_puts_)
    return absl::ResourceExhaustedError("put shard " + shard.job() +
                                        ": no space (injected)");
  BeforeWrite(sync);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(
      db_->Put(wo, ShardKey(shard.job(), shard.step(), shard.rank()),
               shard.SerializeAsString()),
      "put shard " + shard.job());
}

absl::Status Catalog::DeleteShard(const std::string& job, uint64_t step,
                                  uint32_t rank) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Delete(wo, ShardKey(job, step, rank)),
                   "delete shard " + job);
}

absl::StatusOr<std::vector<catv1::ShardRecord>> Catalog::Shards(
    const std::string& job) {
  return ScanPrefix<catv1::ShardRecord>(db_.get(), ShardPrefix(job));
}

absl::StatusOr<uint64_t> Catalog::PutDeleteIntent(
    const catv1::DeleteIntent& intent) {
  const uint64_t id = next_intent_.fetch_add(1);
  CKPT_RETURN_IF_ERROR(
      FromRocks(db_->Put(rocksdb::WriteOptions(), IntentKey(id),
                         intent.SerializeAsString()),
                "put delete intent"));
  return id;
}

absl::Status Catalog::ForgetDeleteIntent(uint64_t id) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Delete(wo, IntentKey(id)), "forget delete intent");
}

void CatalogEdit::PutJob(const catv1::JobRecord& job) {
  ops_.push_back({Kind::kJob, JobKey(job.job()), job.SerializeAsString()});
}

void CatalogEdit::PutShard(const catv1::ShardRecord& shard) {
  ops_.push_back({Kind::kShard,
                  ShardKey(shard.job(), shard.step(), shard.rank()),
                  shard.SerializeAsString()});
}

void CatalogEdit::DeleteShard(const std::string& job, uint64_t step,
                              uint32_t rank) {
  ops_.push_back({Kind::kOther, ShardKey(job, step, rank), std::nullopt});
}

void CatalogEdit::PutDeleteIntent(uint64_t id,
                                  const catv1::DeleteIntent& intent) {
  ops_.push_back({Kind::kOther, IntentKey(id), intent.SerializeAsString()});
}

void CatalogEdit::ForgetDeleteIntent(uint64_t id) {
  ops_.push_back({Kind::kOther, IntentKey(id), std::nullopt});
}

void CatalogEdit::DeleteJob(const std::string& job) {
  ops_.push_back({Kind::kOther, ShardPrefix(job), std::nullopt, true});
  ops_.push_back({Kind::kOther, JobKey(job), std::nullopt});
}

absl::Status Catalog::Apply(const CatalogEdit& edit, bool sync) {
  const CatalogEdit* edits[] = {&edit};
  return ApplyGroup(edits, sync);
}

absl::Status Catalog::ApplyGroup(std::span<const CatalogEdit* const> edits,
                                 bool sync) {
  rocksdb::WriteBatch batch;
  for (const CatalogEdit* edit : edits) {
    for (const CatalogEdit::Op& op : edit->ops_) {
      if (op.value &&
          ((op.kind == CatalogEdit::Kind::kShard && fail_shard_puts_) ||
           (op.kind == CatalogEdit::Kind::kJob && fail_job_puts_)))
        return absl::ResourceExhaustedError(
            "catalog edit: no space (injected)");
      rocksdb::Status s = op.range ? batch.DeleteRange(op.key, op.key + "\xff")
                          : op.value ? batch.Put(op.key, *op.value)
                                     : batch.Delete(op.key);
      if (!s.ok()) return FromRocks(s, "catalog edit");
    }
  }
  if (batch.Count() == 0) return absl::OkStatus();
  BeforeWrite(sync);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(db_->Write(wo, &batch), "catalog edit");
}

absl::StatusOr<std::vector<std::pair<uint64_t, catv1::DeleteIntent>>>
Catalog::DeleteIntents() {
  std::vector<std::pair<uint64_t, catv1::DeleteIntent>> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(kIntentPrefix);
       it->Valid() && it->key().starts_with(kIntentPrefix); it->Next()) {
    catv1::DeleteIntent d;
    const std::string key = it->key().ToString();
    if (!d.ParseFromArray(it->value().data(),
                          static_cast<int>(it->value().size())))
      return absl::DataLossError("catalog: record " + key + " does not parse");
    out.emplace_back(std::strtoull(key.c_str() + 2, nullptr, 10), std::move(d));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan delete intents");
  return out;
}

}  // namespace ckpt::daemon
