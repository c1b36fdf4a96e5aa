#include "daemon/engine_util.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

void Log(const char* level, const std::string& msg) {
  static std::mutex mu;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s.%03dZ ckptd %s: %s\n", ts, ms, level, msg.c_str());
}

}  // namespace

void LogInfo(const std::string& msg) { Log("info", msg); }
void LogWarning(const std::string& msg) { Log("warning", msg); }

storage::ShardInfo ToShardInfo(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors) {
  storage::ShardInfo info;
  info.job = job;
  info.step = step;
  info.rank = rank;
  info.world_size = world_size;
  info.tensors.reserve(tensors.size());
  for (const v1::TensorMeta& m : tensors) {
    storage::ShardTensor t;
    t.name = m.name();
    t.dtype = static_cast<DType>(m.dtype());
    t.shape.assign(m.shape().begin(), m.shape().end());
    t.offset = m.offset();
    t.bytes = m.bytes();
    t.checksum = m.checksum();
    info.tensors.push_back(std::move(t));
  }
  return info;
}

absl::Status CheckLoadedImage(const char* image, uint64_t bytes,
                              const std::string& job, uint64_t step,
                              uint32_t rank, const std::string& key) {
  if (bytes < 2 * storage::kShardAlign)
    return absl::DataLossError(key + ": too short");
  auto header = storage::DecodeHeader({image, storage::kShardAlign});
  if (!header.ok()) return Annotate(header.status(), key);
  if (header->data_offset > bytes ||
      header->footer_offset > bytes - storage::kShardAlign)
    return absl::DataLossError(key + ": offsets beyond the file");
  auto meta = storage::DecodeShardMetadata(
      {image, header->data_offset},
      {image + header->footer_offset, storage::kShardAlign}, bytes);
  if (!meta.ok()) return Annotate(meta.status(), key);
  if (meta->step != step || meta->rank != rank || meta->job != job)
    return absl::DataLossError(absl::StrCat(key, ": holds job '", meta->job,
                                            "' step ", meta->step, " rank ",
                                            meta->rank));
  return absl::OkStatus();
}

void ToTensorMetas(const storage::ShardInfo& info,
                   google::protobuf::RepeatedPtrField<v1::TensorMeta>* out) {
  out->Clear();
  for (const storage::ShardTensor& t : info.tensors) {
    v1::TensorMeta* m = out->Add();
    m->set_name(t.name);
    m->set_dtype(static_cast<uint32_t>(t.dtype));
    for (uint64_t d : t.shape) m->add_shape(d);
    m->set_offset(t.offset);
    m->set_bytes(t.bytes);
    m->set_checksum(t.checksum);
    m->set_has_checksum(true);
  }
}

uint64_t ShardDigest(
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors) {
  uint64_t combined = 0;
  for (const auto& t : tensors) combined = combined * 1000003 ^ t.checksum();
  return combined;
}

}  // namespace ckpt::daemon
