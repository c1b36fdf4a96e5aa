#include "storage/shard_reader.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::storage {
namespace {

static_assert(ShardReader::kStreamBytes % kChecksumChunk == 0);
static_assert(ShardReader::kStreamBytes % kShardAlign == 0);

char* AllocAligned(uint64_t bytes) {
  return static_cast<char*>(std::aligned_alloc(
      kShardAlign, (bytes + kShardAlign - 1) / kShardAlign * kShardAlign));
}

}  // namespace

void ChunkHasher::Add(const char* data, uint64_t len) {
  for (uint64_t off = 0; off < len; off += kChecksumChunk)
    chunk_hashes_.push_back(
        Hash64(data + off, std::min<uint64_t>(kChecksumChunk, len - off)));
}

uint64_t ChunkHasher::Finish() const {
  return CombineChunkHashes(chunk_hashes_);
}

void ShardReader::FreeDeleter::operator()(char* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(
    Backend& backend, std::string_view key) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> object,
                        backend.NewObjectReader(key));
  std::unique_ptr<ShardReader> reader(
      new ShardReader(std::string(key), std::move(object)));
  CKPT_RETURN_IF_ERROR(reader->ReadMetadata());
  return reader;
}

absl::Status ShardReader::ReadMetadata() {
  const uint64_t size = object_->size();
  if (size < kShardAlign)
    return absl::DataLossError(
        absl::StrFormat("%s: truncated: %d bytes, a shard header needs %d",
                        key_, size, kShardAlign));
  std::unique_ptr<char, FreeDeleter> first(AllocAligned(kShardAlign));
  if (!first) return absl::ResourceExhaustedError(key_ + ": out of memory");
  CKPT_RETURN_IF_ERROR(object_->ReadAt(0, first.get(), kShardAlign));
  absl::StatusOr<ShardHeader> header = DecodeHeader({first.get(), kShardAlign});
  if (!header.ok()) return Annotate(header.status(), key_);
  // The header checksum matched, so its sizes are what the writer meant; the
  // object's size bounds what is allocated below.
  if (size != header->image_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %s: %d bytes, header says %d", key_,
        size < header->image_bytes ? "truncated" : "trailing bytes", size,
        header->image_bytes));
  }
  const uint64_t head_bytes = header->data_offset;  // <= footer_offset < size
  std::unique_ptr<char, FreeDeleter> head(AllocAligned(head_bytes));
  std::unique_ptr<char, FreeDeleter> footer(AllocAligned(kShardAlign));
  if (!head || !footer)
    return absl::ResourceExhaustedError(key_ + ": out of memory");
  CKPT_RETURN_IF_ERROR(object_->ReadAt(0, head.get(), head_bytes));
  CKPT_RETURN_IF_ERROR(
      object_->ReadAt(header->footer_offset, footer.get(), kShardAlign));
  absl::StatusOr<ShardInfo> info = DecodeShardMetadata(
      {head.get(), head_bytes}, {footer.get(), kShardAlign}, size);
  if (!info.ok()) return Annotate(info.status(), key_);
  info_ = *std::move(info);
  return absl::OkStatus();
}

absl::Status ShardReader::MismatchError(const ShardTensor& t,
                                        uint64_t computed) const {
  return absl::DataLossError(absl::StrFormat(
      "%s: tensor \"%s\": checksum mismatch (stored 0x%016x, computed 0x%016x)",
      key_, t.name, t.checksum, computed));
}

absl::Status ShardReader::ReadTensor(size_t i, void* dst) {
  if (i >= info_.tensors.size())
    return absl::OutOfRangeError(
        absl::StrFormat("%s: tensor %d of %d", key_, i, info_.tensors.size()));
  const ShardTensor& t = info_.tensors[i];
  CKPT_RETURN_IF_ERROR(object_->ReadAt(t.offset, dst, t.bytes));
  ChunkHasher hasher;
  hasher.Add(static_cast<const char*>(dst), t.bytes);
  const uint64_t computed = hasher.Finish();
  if (computed != t.checksum) return MismatchError(t, computed);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardReader::StreamTensor(
    size_t i, const PieceCallback& on_piece) {
  if (i >= info_.tensors.size())
    return absl::OutOfRangeError(
        absl::StrFormat("%s: tensor %d of %d", key_, i, info_.tensors.size()));
  if (!buffer_) buffer_.reset(AllocAligned(kStreamBytes));
  if (!buffer_)
    return absl::ResourceExhaustedError(key_ +
                                        ": out of memory for the read buffer");
  const ShardTensor& t = info_.tensors[i];
  ChunkHasher hasher;
  for (uint64_t done = 0; done < t.bytes;) {
    const uint64_t want = std::min(kStreamBytes, t.bytes - done);
    // Reading up to the next 4 KiB boundary stays inside the shard (the
    // footer starts at an aligned offset past every tensor) and keeps the
    // read eligible for direct I/O.
    const uint64_t aligned =
        (want + kShardAlign - 1) / kShardAlign * kShardAlign;
    CKPT_RETURN_IF_ERROR(
        object_->ReadAt(t.offset + done, buffer_.get(), aligned));
    hasher.Add(buffer_.get(), want);
    if (on_piece) CKPT_RETURN_IF_ERROR(on_piece(buffer_.get(), want));
    done += want;
  }
  return hasher.Finish();
}

absl::Status ShardReader::Verify(const VerifyCallback& on_tensor) {
  absl::Status first_mismatch;
  size_t mismatches = 0;
  for (size_t i = 0; i < info_.tensors.size(); ++i) {
    const ShardTensor& t = info_.tensors[i];
    CKPT_ASSIGN_OR_RETURN(uint64_t computed, StreamTensor(i, nullptr));
    if (on_tensor) on_tensor(t, computed);
    if (computed != t.checksum && mismatches++ == 0)
      first_mismatch = MismatchError(t, computed);
  }
  if (mismatches <= 1) return first_mismatch;
  return absl::DataLossError(absl::StrCat(first_mismatch.message(), " (and ",
                                          mismatches - 1, " more tensors)"));
}

absl::StatusOr<ShardInfo> ReadShardInfo(Backend& backend,
                                        std::string_view key) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                        ShardReader::Open(backend, key));
  return reader->info();
}

absl::Status VerifyShard(Backend& backend, std::string_view key,
                         const VerifyCallback& on_tensor) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                        ShardReader::Open(backend, key));
  return reader->Verify(on_tensor);
}

}  // namespace ckpt::storage
