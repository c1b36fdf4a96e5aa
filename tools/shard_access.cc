#include "tools/shard_access.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

// A multiple of kChecksumChunk (tensor pieces never split a chunk) and of
// the direct-I/O alignment.
constexpr uint64_t kStreamBuffer = 64 * kChecksumChunk;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<storage::Backend>> OpenRoot(const std::string& dir,
                                                           const std::string& flag) {
  struct stat st;
  if (dir.empty()) return absl::InvalidArgumentError(flag + ": empty path");
  if (stat(dir.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat(flag, " ", dir, ": no such directory"));
  if (!S_ISDIR(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", dir, ": not a directory"));
  storage::LocalBackendOptions o;
  o.root = dir;
  o.sync = false;               // the tools only read through it
  o.remove_tmp_files = false;   // a live daemon may be writing them
  return storage::NewLocalBackend(o);
}

absl::StatusOr<OpenedShard> OpenShard(const ShardSelector& sel) {
  OpenedShard out;
  const bool by_key = !sel.root.empty() || !sel.job.empty() || sel.step || sel.rank;
  if (!sel.file.empty()) {
    if (by_key)
      return absl::InvalidArgumentError("give either FILE or --root/--job/--step/--rank, not both");
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(sel.file, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("FILE ", sel.file, ": ", ec.message()));
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(sel.file, ": no such file"));
    if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(sel.file, ": not a regular file"));
    auto backend = OpenRoot(p.parent_path().string(), "FILE's directory");
    if (!backend.ok()) return backend.status();
    out.backend = std::move(*backend);
    out.key = p.filename().string();
    out.path = sel.file;
    return out;
  }
  if (sel.root.empty() || sel.job.empty() || !sel.step || !sel.rank)
    return absl::InvalidArgumentError("give a shard FILE, or all of --root, --job, --step and --rank");
  absl::Status s = ValidateJobName(sel.job, "--job");
  if (!s.ok()) return s;
  auto backend = OpenRoot(sel.root, "--root");
  if (!backend.ok()) return backend.status();
  out.backend = std::move(*backend);
  out.key = storage::ShardKey(sel.job, *sel.step, *sel.rank);
  out.path = (std::filesystem::path(sel.root) / out.key).string();
  return out;
}

absl::Status StreamShard(storage::Backend& backend, const std::string& key,
                         const storage::ShardInfo& info, const ShardSink& sink,
                         Progress* progress) {
  std::unique_ptr<char, FreeDeleter> buf(
      static_cast<char*>(std::aligned_alloc(storage::kShardAlign, kStreamBuffer)));
  if (!buf) return absl::ResourceExhaustedError(key + ": out of memory for the read buffer");

  // Copies [begin, end) of non-tensor bytes to sink.other.
  auto pass_other = [&](uint64_t begin, uint64_t end) -> absl::Status {
    while (begin < end) {
      uint64_t n = std::min(kStreamBuffer, end - begin);
      absl::Status s = backend.ReadAt(key, begin, buf.get(), n);
      if (s.ok() && sink.other) s = sink.other(begin, buf.get(), n);
      if (!s.ok()) return s;
      if (progress) progress->Add(n);
      begin += n;
    }
    return absl::OkStatus();
  };

  uint64_t pos = 0;
  std::vector<uint64_t> hashes;
  for (const storage::ShardTensor& t : info.tensors) {
    absl::Status s = pass_other(pos, t.offset);
    if (!s.ok()) return s;
    hashes.clear();
    for (uint64_t done = 0; done < t.bytes;) {
      uint64_t n = std::min(kStreamBuffer, t.bytes - done);
      s = backend.ReadAt(key, t.offset + done, buf.get(), n);
      if (!s.ok()) return s;
      for (uint64_t off = 0; off < n; off += kChecksumChunk)
        hashes.push_back(Hash64(buf.get() + off, std::min(kChecksumChunk, n - off)));
      if (sink.tensor) s = sink.tensor(t, buf.get(), n);
      if (!s.ok()) return s;
      if (progress) progress->Add(n);
      done += n;
    }
    uint64_t computed = CombineChunkHashes(hashes);
    if (computed != t.checksum)
      return absl::DataLossError(absl::StrFormat(
          "%s: tensor \"%s\": checksum mismatch (stored %s, computed %s)", key, t.name,
          HexChecksum(t.checksum), HexChecksum(computed)));
    if (sink.tensor_done) CKPT_RETURN_IF_ERROR(sink.tensor_done(t));
    pos = t.offset + t.bytes;
  }
  return pass_other(pos, info.layout.image_bytes);
}

std::string HexChecksum(uint64_t v) { return absl::StrFormat("0x%016x", v); }

std::string ShapeString(const storage::ShardTensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape, ", "), "]");
}

}  // namespace ckpt::tools
