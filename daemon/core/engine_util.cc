#include "daemon/core/engine_util.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status BelowNewestError(const std::string& job, uint32_t rank,
                              uint64_t step,
                              const std::vector<uint64_t>& newer) {
  // A long list (retention keeps few steps, but it is configurable) is cut.
  constexpr size_t kNamed = 8;
  std::string steps = absl::StrJoin(
      newer.begin(), newer.begin() + std::min(newer.size(), kNamed), ", ");
  if (newer.size() > kNamed)
    absl::StrAppend(&steps, ", ... (", newer.size(), " steps)");
  return absl::FailedPreconditionError(absl::StrCat(
      "step: ", step, " is below this rank's newest step(s) ", steps,
      " of job ", job, " (rank ", rank,
      "); a save would delete them. Restore an older step first (the normal "
      "recovery path), or ask for the rewind explicitly (SaveOptions.rewind "
      "/ rewind=True / ckptctl rollback)"));
}

uint64_t NewJobLife() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

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
    t.global_shape.assign(m.global_shape().begin(), m.global_shape().end());
    t.piece_offsets.assign(m.piece_offsets().begin(), m.piece_offsets().end());
    t.global_name = m.global_name();
    info.tensors.push_back(std::move(t));
  }
  return info;
}

std::vector<bool> KnownChecksums(
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors) {
  std::vector<bool> known;
  known.reserve(tensors.size());
  for (const v1::TensorMeta& m : tensors) known.push_back(m.has_checksum());
  return known;
}

void ToTensorMetas(const storage::ShardInfo& info,
                   google::protobuf::RepeatedPtrField<v1::TensorMeta>* out) {
  // The chunk hashes a save sent are not in the shard file: kept from the
  // entries replaced, where the tensor is the same (name, place, checksum).
  google::protobuf::RepeatedPtrField<v1::TensorMeta> old;
  old.Swap(out);
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const storage::ShardTensor& t = info.tensors[i];
    v1::TensorMeta* m = out->Add();
    if (i < static_cast<size_t>(old.size())) {
      v1::TensorMeta& o = old[static_cast<int>(i)];
      if (o.chunk_hashes_size() != 0 && o.name() == t.name &&
          o.offset() == t.offset && o.bytes() == t.bytes && o.has_checksum() &&
          o.checksum() == t.checksum)
        m->mutable_chunk_hashes()->Swap(o.mutable_chunk_hashes());
    }
    m->set_name(t.name);
    m->set_dtype(static_cast<uint32_t>(t.dtype));
    for (uint64_t d : t.shape) m->add_shape(d);
    m->set_offset(t.offset);
    m->set_bytes(t.bytes);
    m->set_checksum(t.checksum);
    m->set_has_checksum(true);
    for (uint64_t d : t.global_shape) m->add_global_shape(d);
    for (uint64_t d : t.piece_offsets) m->add_piece_offsets(d);
    if (!t.global_name.empty()) m->set_global_name(t.global_name);
  }
}

}  // namespace ckpt::daemon
