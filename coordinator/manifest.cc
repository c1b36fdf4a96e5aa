#include "coordinator/manifest.h"

#include <set>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/shard_format.h"

namespace ckpt::coordinator {
namespace {

constexpr uint64_t kMaxManifestBytes = 64 << 20;

absl::Status Bad(std::string_view key, const std::string& what) {
  return absl::DataLossError(absl::StrCat("global manifest ", std::string(key), ": ", what));
}

bool IsHex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string GlobalManifestKey(std::string_view job, uint64_t step) {
  return storage::ManifestKey(job, step) + ".global";
}

std::string DigestHex(uint64_t digest) { return absl::StrFormat("%016x", digest); }

std::string EncodeGlobalManifest(const coord::v1::GlobalManifest& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  // Printing a message we built cannot fail; an empty result would be
  // refused by every reader.
  (void)google::protobuf::util::MessageToJsonString(m, &json, opts);
  return json + "\n";
}

absl::StatusOr<coord::v1::GlobalManifest> DecodeGlobalManifest(std::string_view json,
                                                               std::string_view key,
                                                               std::string_view job,
                                                               uint64_t step) {
  coord::v1::GlobalManifest m;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;  // newer writers may add fields
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &m, opts);
  if (!parsed.ok()) return Bad(key, "does not parse: " + parsed.ToString());
  if (m.format() != kGlobalManifestFormat)
    return Bad(key, absl::StrCat("format: \"", m.format(), "\", expected ", kGlobalManifestFormat));
  if (m.job() != job) return Bad(key, absl::StrCat("job: \"", m.job(), "\", expected \"", std::string(job), "\""));
  if (m.step() != step) return Bad(key, absl::StrCat("step: ", m.step(), ", expected ", step));
  if (m.world_size() == 0) return Bad(key, "world_size: 0");
  if (static_cast<uint32_t>(m.shards_size()) != m.world_size())
    return Bad(key, absl::StrCat("shards: ", m.shards_size(), " entries for world_size ", m.world_size()));
  std::set<uint32_t> seen;
  for (const auto& s : m.shards()) {
    if (s.rank() >= m.world_size() || !seen.insert(s.rank()).second)
      return Bad(key, absl::StrCat("shards.rank: ", s.rank(), " out of range or repeated"));
    if (s.key().empty()) return Bad(key, absl::StrCat("shards[rank ", s.rank(), "].key: empty"));
    if (!IsHex16(s.checksum_digest()))
      return Bad(key, absl::StrCat("shards[rank ", s.rank(), "].checksum_digest: \"",
                                   s.checksum_digest(), "\" is not 16 hex digits"));
  }
  return m;
}

absl::Status WriteGlobalManifest(storage::Backend* backend, const coord::v1::GlobalManifest& m) {
  return backend->PutSmallObject(GlobalManifestKey(m.job(), m.step()), EncodeGlobalManifest(m));
}

absl::StatusOr<coord::v1::GlobalManifest> ReadGlobalManifest(storage::Backend* backend,
                                                             std::string_view job, uint64_t step) {
  std::string key = GlobalManifestKey(job, step);
  absl::StatusOr<uint64_t> size = backend->ObjectSize(key);
  if (!size.ok()) return size.status();
  if (*size > kMaxManifestBytes) return Bad(key, absl::StrCat("size ", *size, " is implausible"));
  std::string json(*size, '\0');
  absl::Status s = backend->ReadAt(key, 0, json.data(), json.size());
  if (!s.ok()) return s;
  return DecodeGlobalManifest(json, key, job, step);
}

}  // namespace ckpt::coordinator
