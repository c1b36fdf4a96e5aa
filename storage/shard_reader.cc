#include "storage/shard_reader.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::storage {
namespace {

absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

// Reads go through this buffer; a multiple of kChecksumChunk so chunk hashes
// can be computed per buffer fill, and of kShardAlign for direct I/O.
constexpr uint64_t kVerifyBufferBytes = 16 * kChecksumChunk;
static_assert(kVerifyBufferBytes % kShardAlign == 0);

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeDeleter>;

AlignedBuffer AllocAligned(uint64_t bytes) {
  return AlignedBuffer(static_cast<char*>(std::aligned_alloc(kShardAlign, bytes)));
}

}  // namespace

absl::StatusOr<ShardInfo> ReadShardInfo(Backend& backend, std::string_view key) {
  const std::string where(key);
  CKPT_ASSIGN_OR_RETURN(uint64_t size, backend.ObjectSize(key));
  if (size < kShardAlign)
    return absl::DataLossError(absl::StrFormat("%s: truncated: %d bytes, a shard header needs %d",
                                               where, size, kShardAlign));
  AlignedBuffer first = AllocAligned(kShardAlign);
  if (!first) return absl::ResourceExhaustedError(where + ": out of memory");
  CKPT_RETURN_IF_ERROR(backend.ReadAt(key, 0, first.get(), kShardAlign));
  absl::StatusOr<ShardHeader> header = DecodeHeader({first.get(), kShardAlign});
  if (!header.ok()) return Annotate(header.status(), where);
  // The header checksum matched, so its sizes are what the writer meant; the
  // file size bounds what is allocated below.
  if (size != header->image_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %s: %d bytes, header says %d", where,
        size < header->image_bytes ? "truncated" : "trailing bytes", size, header->image_bytes));
  }
  const uint64_t head_bytes = header->data_offset;  // <= footer_offset < size
  AlignedBuffer head = AllocAligned(head_bytes);
  AlignedBuffer footer = AllocAligned(kShardAlign);
  if (!head || !footer) return absl::ResourceExhaustedError(where + ": out of memory");
  CKPT_RETURN_IF_ERROR(backend.ReadAt(key, 0, head.get(), head_bytes));
  CKPT_RETURN_IF_ERROR(backend.ReadAt(key, header->footer_offset, footer.get(), kShardAlign));
  absl::StatusOr<ShardInfo> info =
      DecodeShardMetadata({head.get(), head_bytes}, {footer.get(), kShardAlign}, size);
  if (!info.ok()) return Annotate(info.status(), where);
  return info;
}

absl::Status VerifyShard(Backend& backend, std::string_view key, const VerifyCallback& on_tensor) {
  CKPT_ASSIGN_OR_RETURN(ShardInfo info, ReadShardInfo(backend, key));
  AlignedBuffer buffer = AllocAligned(kVerifyBufferBytes);
  if (!buffer) return absl::ResourceExhaustedError(std::string(key) + ": out of memory");
  std::string first_mismatch;
  size_t mismatches = 0;
  std::vector<uint64_t> chunk_hashes;
  for (const ShardTensor& t : info.tensors) {
    chunk_hashes.clear();
    uint64_t done = 0;
    while (done < t.bytes) {
      const uint64_t want = std::min<uint64_t>(kVerifyBufferBytes, t.bytes - done);
      // Reading up to the next 4 KiB boundary stays inside the shard (the
      // footer starts at an aligned offset past every tensor) and keeps the
      // read eligible for direct I/O.
      const uint64_t aligned = (want + kShardAlign - 1) / kShardAlign * kShardAlign;
      CKPT_RETURN_IF_ERROR(backend.ReadAt(key, t.offset + done, buffer.get(), aligned));
      for (uint64_t off = 0; off < want; off += kChecksumChunk)
        chunk_hashes.push_back(
            Hash64(buffer.get() + off, std::min<uint64_t>(kChecksumChunk, want - off)));
      done += want;
    }
    const uint64_t computed = CombineChunkHashes(chunk_hashes);
    if (on_tensor) on_tensor(t, computed);
    if (computed != t.checksum && mismatches++ == 0) {
      first_mismatch = absl::StrFormat("tensor \"%s\": checksum mismatch (stored %#018x, computed %#018x)",
                                       t.name, t.checksum, computed);
    }
  }
  if (mismatches == 0) return absl::OkStatus();
  std::string msg = absl::StrCat(AV(key), ": ", first_mismatch);
  if (mismatches > 1) absl::StrAppend(&msg, " (and ", mismatches - 1, " more tensors)");
  return absl::DataLossError(msg);
}

}  // namespace ckpt::storage
