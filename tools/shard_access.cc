#include "tools/shard_access.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "storage/keys.h"
#include "storage/object_backend.h"
#include "storage/open_backend.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

std::string Leaf(const std::string& key) {
  size_t slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

// FILE as (root, key): the root of its layout when its last three path
// components form a key, else its directory and its name.
std::pair<std::filesystem::path, std::string> SplitFile(
    const std::filesystem::path& p) {
  const std::filesystem::path step_dir = p.parent_path(),
                              job_dir = step_dir.parent_path();
  const std::string key =
      absl::StrCat(job_dir.filename().string(), "/",
                   step_dir.filename().string(), "/", p.filename().string());
  if (storage::ParseKey(key).ok()) return {job_dir.parent_path(), key};
  return {p.parent_path(), p.filename().string()};
}

// FILE given as "s3://bucket/[prefix/]<job>/step-<N>/<name>": the root is
// everything before the key's three components.
absl::StatusOr<OpenedShard> OpenObjectFile(const std::string& url) {
  CKPT_ASSIGN_OR_RETURN(storage::ObjectUrl parsed,
                        storage::ParseObjectUrl(url, "FILE"));
  std::vector<std::string> parts = absl::StrSplit(parsed.prefix, '/');
  if (parts.size() < 3)
    return absl::InvalidArgumentError(
        absl::StrCat("FILE ", url.substr(0, 200),
                     ": not s3://BUCKET/[PREFIX/]JOB/step-N/NAME"));
  const std::string key = absl::StrJoin(parts.end() - 3, parts.end(), "/");
  const std::string prefix = absl::StrJoin(parts.begin(), parts.end() - 3, "/");
  const std::string root =
      absl::StrCat("s3://", parsed.bucket, prefix.empty() ? "" : "/", prefix);
  OpenedShard out;
  CKPT_ASSIGN_OR_RETURN(out.backend, OpenRoot(root, "FILE"));
  out.key = key;
  out.path = url;
  return out;
}

// The key of sel's shard: the one-node key if present, else the one node's
// copy ("rank-R.<node>.shard"), or sel.node's when several nodes wrote it.
absl::StatusOr<std::string> ResolveShardKey(storage::Backend& backend,
                                            const ShardSelector& sel) {
  if (!sel.node.empty()) {
    CKPT_RETURN_IF_ERROR(ValidateJobName(sel.node, "--node"));
    return storage::ShardKey(sel.job, *sel.step, *sel.rank, sel.node);
  }
  const std::string plain = storage::ShardKey(sel.job, *sel.step, *sel.rank);
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        backend.List(storage::StepPrefix(sel.job, *sel.step)));
  std::vector<std::string> found;
  for (const std::string& k : keys)
    if (storage::IsShardKeyOf(k, sel.job, *sel.step, *sel.rank))
      found.push_back(k);
  if (found.size() <= 1 || std::count(found.begin(), found.end(), plain))
    return found.size() == 1
               ? found[0]
               : plain;  // none: the plain key's NotFound names it
  std::vector<std::string> leaves;
  for (const std::string& k : found) leaves.push_back(Leaf(k));
  return absl::InvalidArgumentError(
      absl::StrCat("--rank ", *sel.rank, ": several nodes wrote it (",
                   absl::StrJoin(leaves, ", "), "); pick one with --node"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<storage::Backend>> OpenRoot(
    const std::string& dir, const std::string& flag) {
  storage::OpenBackendOptions o;
  o.field = flag;
  o.relative_ok = true;
  o.must_exist = true;
  o.local.sync = false;              // the tools only read through it
  o.local.remove_tmp_files = false;  // a live daemon may be writing them
  return storage::OpenBackend(dir, o);
}

absl::StatusOr<RootContents> ScanRoot(storage::Backend& backend,
                                      const std::string& prefix) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys, backend.List(prefix));
  RootContents out;
  for (std::string& k : keys) {
    if (absl::StartsWith(k, ".catalog/")) continue;  // the daemon's RocksDB
    absl::StatusOr<storage::ParsedKey> p = storage::ParseKey(k);
    if (p.ok() && p->kind == storage::KeyKind::kShard) {
      out.shards.push_back(std::move(k));
    } else if (p.ok() && p->kind == storage::KeyKind::kManifest) {
      out.node_manifests.push_back(std::move(k));
    } else if (p.ok()) {
      out.global_manifests.push_back(std::move(k));
    } else if (absl::EndsWith(k, ".shard")) {
      out.shards.push_back(std::move(k));
    } else if (absl::StartsWith(Leaf(k), "MANIFEST")) {
      out.unrecognized.emplace_back(std::move(k),
                                    std::string(p.status().message()));
    }
  }
  return out;
}

absl::StatusOr<OpenedShard> OpenShard(const ShardSelector& sel) {
  OpenedShard out;
  const bool by_key = !sel.root.empty() || !sel.job.empty() || sel.step ||
                      sel.rank || !sel.node.empty();
  if (!sel.file.empty()) {
    if (by_key)
      return absl::InvalidArgumentError(
          "give either FILE or --root/--job/--step/--rank/--node, not both");
    if (storage::IsObjectUrl(sel.file)) return OpenObjectFile(sel.file);
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(sel.file, ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat("FILE ", sel.file, ": ", ec.message()));
    struct stat st;
    if (stat(p.c_str(), &st) != 0)
      return absl::NotFoundError(absl::StrCat(sel.file, ": no such file"));
    if (!S_ISREG(st.st_mode))
      return absl::InvalidArgumentError(
          absl::StrCat(sel.file, ": not a regular file"));
    auto [root, key] = SplitFile(p.lexically_normal());
    auto backend = OpenRoot(root.string(), "FILE's directory");
    if (!backend.ok()) return backend.status();
    out.backend = std::move(*backend);
    out.key = key;
    out.path = sel.file;
    return out;
  }
  if (sel.root.empty() || sel.job.empty() || !sel.step || !sel.rank)
    return absl::InvalidArgumentError(
        "give a shard FILE, or all of --root, --job, --step and --rank");
  absl::Status s = ValidateJobName(sel.job, "--job");
  if (!s.ok()) return s;
  auto backend = OpenRoot(sel.root, "--root");
  if (!backend.ok()) return backend.status();
  out.backend = std::move(*backend);
  CKPT_ASSIGN_OR_RETURN(out.key, ResolveShardKey(*out.backend, sel));
  out.path = DisplayPath(*out.backend, sel.root, out.key);
  return out;
}

std::string DisplayPath(const storage::Backend& backend,
                        const std::string& root, const std::string& key) {
  if (storage::IsObjectUrl(root)) {
    std::string r = root;
    while (!r.empty() && r.back() == '/') r.pop_back();
    return absl::StrCat(r, "/", key);
  }
  return backend.LocalPath(key).value_or(key);
}

absl::Status StreamShard(storage::ShardReader& reader, const ShardSink& sink,
                         Progress* progress) {
  const storage::ShardInfo& info = reader.info();
  // Non-tensor bytes (header, index, padding, footer) are small: a buffer of
  // the largest gap.
  std::string gap;
  auto pass_other = [&](uint64_t begin, uint64_t end) -> absl::Status {
    if (begin >= end) return absl::OkStatus();
    gap.resize(end - begin);
    CKPT_RETURN_IF_ERROR(reader.object().ReadAt(begin, gap.data(), gap.size()));
    if (sink.other)
      CKPT_RETURN_IF_ERROR(sink.other(begin, gap.data(), gap.size()));
    if (progress) progress->Add(gap.size());
    return absl::OkStatus();
  };
  uint64_t pos = 0;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const storage::ShardTensor& t = info.tensors[i];
    CKPT_RETURN_IF_ERROR(pass_other(pos, t.offset));
    CKPT_ASSIGN_OR_RETURN(
        uint64_t computed,
        reader.StreamTensor(i, [&](const char* d, uint64_t n) -> absl::Status {
          if (sink.tensor) CKPT_RETURN_IF_ERROR(sink.tensor(t, d, n));
          if (progress) progress->Add(n);
          return absl::OkStatus();
        }));
    if (computed != t.checksum) return reader.MismatchError(t, computed);
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
