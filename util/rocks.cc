#include "util/rocks.h"

#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "util/strings.h"

namespace ckpt {

absl::Status FromRocks(const rocksdb::Status& s, std::string_view store,
                       std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound())
    return absl::NotFoundError(
        absl::StrCat(AV(store), ": ", AV(what), ": not found"));
  return absl::InternalError(
      absl::StrCat(AV(store), ": ", AV(what), ": ", s.ToString()));
}

absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenRocksDb(
    const std::string& dir, std::string_view store) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_background_jobs = 1;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) return FromRocks(s, store, "open " + dir);
  return std::unique_ptr<rocksdb::DB>(db);
}

}  // namespace ckpt
