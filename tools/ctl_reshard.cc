// reshard: one complete step written as a checkpoint of another world size
// into a new root, which a ckptd started on it serves as it would have
// served a job that saved there.
//
// The new layout: a tensor saved in pieces (any piece smaller than the
// global tensor) is split along its split dimension (the index's: the
// first dimension along which its pieces' offsets differ) as torch.chunk
// splits it: chunks of ceil(D / N) rows, so that the last ranks may get a
// shorter chunk or an empty one ([0] rows at offset D), which is then saved
// as an empty piece. A whole tensor (every piece the whole tensor) goes to
// every rank whole, with its layout fields if it was saved with them. Every
// rank's shard holds every tensor, under the global name, in name order.
//
// What is written is what the daemon writes, through its writers: shard
// images whose header, index and footer are storage::EncodeShardMetadata's
// (tensor bytes streamed into the file window by window, their checksums
// computed on the way), the one-node MANIFEST with its layout index
// (storage::WriteNodeManifest, storage::BuildLayoutIndex), and the records
// of the daemon's catalog (daemon::Catalog: the job, owned by --uid or the
// caller's uid, and each shard DURABLE) from which a ckptd started on the new
// root recovers the step. All of it goes to "<out>.partial.<pid>" first,
// renamed to `out` at the end (never over an existing one); a failure removes
// it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/catalog.h"
#include "daemon/core/engine_options.h"
#include "daemon/core/engine_util.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/object_backend.h"
#include "storage/shard_format.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/out_file.h"
#include "tools/step_source.h"
#include "tools/text_output.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

static_assert(StepSource::kWindowBytes % kChecksumChunk == 0);

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// Removes the partial root unless released.
class PartialDir {
 public:
  explicit PartialDir(std::string path) : path_(std::move(path)) {}
  ~PartialDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// A shard file being written: created, sized, tensor bytes at their
// offsets; metadata last.
class ShardFile {
 public:
  ~ShardFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  // give: chown the file to `owner`.
  [[nodiscard]] absl::Status Create(const std::string& path, uint64_t size,
                                    bool give, uid_t owner) {
    path_ = path;
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path(), ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("create the directory of ", path, ": ", ec.message()));
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) return ErrnoToStatus(errno, "create " + path);
    if (give && ::fchown(fd_, owner, static_cast<gid_t>(-1)) != 0)
      return ErrnoToStatus(errno,
                           absl::StrCat("--uid ", owner, ": chown ", path));
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      return ErrnoToStatus(errno, "size " + path);
    return absl::OkStatus();
  }
  [[nodiscard]] absl::Status WriteAt(uint64_t offset, const char* data,
                                     uint64_t len) {
    while (len > 0) {
      ssize_t n = ::pwrite(fd_, data, len, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoToStatus(errno, "write " + path_);
      data += n;
      offset += static_cast<uint64_t>(n);
      len -= static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }
  // Header, index and footer by the shard format's encoder, into a mapping
  // of the image's size whose data pages are never touched (so never
  // allocated), then written in place; fsync.
  [[nodiscard]] absl::Status Finish(const storage::ShardInfo& info) {
    const storage::ShardLayout& l = info.layout;
    void* map = ::mmap(nullptr, l.image_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) return ErrnoToStatus(errno, "map " + path_);
    char* image = static_cast<char*>(map);
    absl::Status s = storage::EncodeShardMetadata(
        info, std::span<char>(image, l.image_bytes));
    if (s.ok()) s = WriteAt(0, image, l.data_offset);
    if (s.ok())
      s = WriteAt(l.footer_offset, image + l.footer_offset,
                  l.image_bytes - l.footer_offset);
    ::munmap(map, l.image_bytes);
    if (s.ok() && ::fsync(fd_) != 0) s = ErrnoToStatus(errno, "fsync " + path_);
    return s;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + dir);
  absl::Status s;
  if (::fsync(fd) != 0) s = ErrnoToStatus(errno, "fsync " + dir);
  ::close(fd);
  return s;
}

}  // namespace

absl::Status RunReshard(const ReshardArgs& args, bool json) {
  // The daemon's bound on a job's world size.
  const uint32_t kMaxWorldSize = daemon::EngineOptions().max_world_size;
  const uint32_t n = args.world_size;
  if (n == 0 || n > kMaxWorldSize)
    return absl::InvalidArgumentError(absl::StrCat(
        "--world-size: ", n, " is not in [1, ", kMaxWorldSize, "]"));
  if (!args.step) return absl::InvalidArgumentError("--step: required");
  if (args.out.empty()) return absl::InvalidArgumentError("--out: empty path");
  if (storage::IsObjectUrl(args.out))
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", args.out,
                     ": must be a local directory (the new root of a ckptd)"));
  struct stat st;
  if (::lstat(args.out.c_str(), &st) == 0)
    return absl::AlreadyExistsError(absl::StrCat(
        "--out ", args.out, ": exists; reshard writes a new root"));

  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StepSource> src,
                        StepSource::Open(args.root, args.job, *args.step));
  if (src->torch())
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", src->job(), " step ", src->step(),
        " was saved by ckpt.torch: each rank's shard holds its own "
        "structure (%ckpt/skeleton, with its pieces' shapes), which reshard "
        "does not rewrite; export the step (ckptctl export) instead"));
  const storage::LayoutIndex& saved = src->index();
  const uint64_t created = NowNs();

  // The new shards' tensor indexes and the layout they request.
  std::vector<storage::ShardInfo> infos(n);
  for (uint32_t r = 0; r < n; ++r) {
    infos[r].job = src->job();
    infos[r].step = src->step();
    infos[r].rank = r;
    infos[r].world_size = n;
    infos[r].created_unix_ns = created;
  }
  uint64_t sharded = 0;
  for (const storage::LayoutTensor& t : saved.tensors()) {
    const std::vector<uint64_t> global(t.global_shape.begin(),
                                       t.global_shape.begin() + t.ndim);
    bool whole = true, had_layout = false;
    for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p) {
      const storage::Box box = saved.PieceBox(p);
      for (uint32_t d = 0; d < t.ndim; ++d)
        whole = whole && box.offsets[d] == 0 && box.lengths[d] == global[d];
      had_layout = had_layout || !src->PieceTensor(p).global_shape.empty();
    }
    sharded += whole ? 0 : 1;
    const uint32_t d = t.split_dim;
    const uint64_t chunk =
        whole ? 0 : (global[d] + n - 1) / n;  // torch.chunk's chunk size
    for (uint32_t r = 0; r < n; ++r) {
      storage::ShardTensor& out = infos[r].tensors.emplace_back();
      out.name = t.name;
      out.dtype = t.dtype;
      out.shape = global;
      if (whole) {
        if (had_layout) {
          out.global_shape = global;
          out.piece_offsets.assign(t.ndim, 0);
        }
      } else {
        const uint64_t lo = std::min<uint64_t>(r * chunk, global[d]);
        out.shape[d] = std::min(chunk, global[d] - lo);
        out.global_shape = global;
        out.piece_offsets.assign(t.ndim, 0);
        out.piece_offsets[d] = lo;
      }
      out.bytes = DTypeSize(t.dtype);
      for (uint64_t x : out.shape) out.bytes *= x;
    }
  }
  uint64_t total_bytes = 0, data_bytes = 0;
  for (storage::ShardInfo& info : infos) {
    std::vector<uint64_t> sizes;
    for (const storage::ShardTensor& t : info.tensors) sizes.push_back(t.bytes);
    CKPT_ASSIGN_OR_RETURN(storage::ShardLayout layout,
                          storage::ComputeLayout(sizes, info.HasLayout()));
    for (size_t i = 0; i < info.tensors.size(); ++i) {
      info.tensors[i].offset = layout.tensor_offsets[i];
      data_bytes += info.tensors[i].bytes;
    }
    CKPT_RETURN_IF_ERROR(storage::ValidateShardInfo(&info));
    total_bytes += info.layout.image_bytes;
  }
  storage::LayoutIndexBuilder want(n);
  for (size_t i = 0; i < saved.tensors().size(); ++i) {
    const storage::LayoutTensor& t = saved.tensors()[i];
    CKPT_ASSIGN_OR_RETURN(uint32_t id,
                          want.AddTensor(t.name, t.dtype,
                                         std::span<const uint64_t>(
                                             t.global_shape.data(), t.ndim)));
    for (uint32_t r = 0; r < n; ++r) {
      const storage::ShardTensor& piece = infos[r].tensors[i];
      if (piece.bytes == 0) continue;  // an empty piece holds nothing to read
      const std::vector<uint64_t> zeros(t.ndim, 0);
      CKPT_RETURN_IF_ERROR(want.AddPiece(
          id, r, piece.offset,
          piece.piece_offsets.empty() ? zeros : piece.piece_offsets,
          piece.shape));
    }
  }
  CKPT_ASSIGN_OR_RETURN(storage::LayoutIndex requested,
                        std::move(want).Finish());
  const uid_t uid = args.uid.value_or(getuid());
  const bool give = uid != geteuid();
  // Write everything under the partial root.
  const std::string tmp = absl::StrCat(args.out, ".partial.", getpid());
  if (::mkdir(tmp.c_str(), 0755) != 0)
    return ErrnoToStatus(errno, "create " + tmp);
  PartialDir partial(tmp);
  std::vector<ShardFile> files(n);
  for (uint32_t r = 0; r < n; ++r)
    CKPT_RETURN_IF_ERROR(files[r].Create(
        absl::StrCat(tmp, "/", storage::ShardKey(src->job(), src->step(), r)),
        infos[r].layout.image_bytes, give, uid));
  std::vector<storage::ChunkHasher> hashers(requested.num_pieces());
  Progress progress("reshard", data_bytes);
  CKPT_RETURN_IF_ERROR(src->AssembleRequested(
      requested,
      [&](uint64_t q, uint64_t at, const char* data,
          uint64_t len) -> absl::Status {
        const uint32_t r = requested.piece_rank(q);
        CKPT_RETURN_IF_ERROR(
            files[r].WriteAt(requested.piece_data_offset(q) + at, data, len));
        hashers[q].Add(data, len);
        progress.Add(len);
        return absl::OkStatus();
      }));
  // Checksums: of the bytes written (an empty tensor's is the empty one's).
  const uint64_t empty_sum = storage::ChunkHasher().Finish();
  for (storage::ShardInfo& info : infos)
    for (storage::ShardTensor& t : info.tensors) t.checksum = empty_sum;
  for (uint64_t q = 0; q < requested.num_pieces(); ++q) {
    storage::ShardInfo& info = infos[requested.piece_rank(q)];
    auto it = std::lower_bound(info.tensors.begin(), info.tensors.end(),
                               requested.piece_data_offset(q),
                               [](const storage::ShardTensor& t, uint64_t off) {
                                 return t.offset < off;
                               });
    // An empty tensor has the offset of the next one, and is no piece.
    while (it != info.tensors.end() && it->bytes == 0 &&
           it->offset == requested.piece_data_offset(q))
      ++it;
    if (it == info.tensors.end() ||
        it->offset != requested.piece_data_offset(q))
      return absl::InternalError("reshard: a requested piece is in no tensor");
    it->checksum = hashers[q].Finish();
  }
  for (uint32_t r = 0; r < n; ++r)
    CKPT_RETURN_IF_ERROR(files[r].Finish(infos[r]));
  files.clear();

  // The manifest, as the daemon writes it once every rank is durable.
  storage::LocalBackendOptions lo;
  lo.root = tmp;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> backend,
                        storage::NewLocalBackend(lo));
  storage::v1::NodeManifest m;
  m.set_job(src->job());
  m.set_step(src->step());
  m.set_world_size(n);
  std::vector<std::vector<v1::TensorMeta>> metas(n);
  bool layouts = false;
  for (uint32_t r = 0; r < n; ++r) {
    const storage::ShardInfo& info = infos[r];
    storage::v1::NodeManifestShard* s = m.add_shards();
    s->set_rank(r);
    s->set_key(storage::ShardKey(src->job(), src->step(), r));
    s->set_bytes(info.layout.image_bytes);
    s->set_tensors(static_cast<uint32_t>(info.tensors.size()));
    s->set_checksums_digest(storage::DigestHex(storage::ChecksumsDigest(info)));
    google::protobuf::RepeatedPtrField<v1::TensorMeta> fields;
    daemon::ToTensorMetas(info, &fields);
    metas[r].assign(fields.begin(), fields.end());
    layouts = layouts || info.HasLayout();
  }
  if (layouts) {
    CKPT_ASSIGN_OR_RETURN(storage::LayoutIndex index,
                          storage::BuildLayoutIndex(n, metas));
    m.set_layout_index(storage::SerializeLayoutIndex(index));
  }
  CKPT_RETURN_IF_ERROR(storage::WriteNodeManifest(*backend, m));
  backend.reset();

  // The catalog a ckptd on the new root recovers the step from.
  {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<daemon::Catalog> catalog,
                          daemon::Catalog::Open(tmp + "/.catalog"));
    daemon::catv1::JobRecord job;
    job.set_job(src->job());
    job.set_world_size(n);
    job.set_uid(uid);
    job.set_num_slots(daemon::EngineOptions{}.default_num_slots);
    job.set_life_ns(created);
    CKPT_RETURN_IF_ERROR(catalog->PutJob(job));
    for (uint32_t r = 0; r < n; ++r) {
      daemon::catv1::ShardRecord rec;
      rec.set_job(src->job());
      rec.set_step(src->step());
      rec.set_rank(r);
      rec.set_state(daemon::catv1::ShardRecord::DURABLE);
      rec.set_image_bytes(infos[r].layout.image_bytes);
      rec.set_path(storage::ShardKey(src->job(), src->step(), r));
      daemon::ToTensorMetas(infos[r], rec.mutable_tensors());
      rec.set_world_size(n);
      rec.set_created_unix_ns(created);
      CKPT_RETURN_IF_ERROR(catalog->PutShard(rec, /*sync=*/true));
    }
  }
  // The shard files' names are in the step's directory (the manifest's
  // write synced it); the directories' own names, here.
  CKPT_RETURN_IF_ERROR(
      SyncDir(absl::StrCat(tmp, "/", storage::JobPrefix(src->job()))));
  CKPT_RETURN_IF_ERROR(SyncDir(tmp));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, args.out.c_str(),
                  RENAME_NOREPLACE) != 0)
    return errno == EEXIST ? absl::AlreadyExistsError(absl::StrCat(
                                 "--out ", args.out, ": appeared meanwhile"))
                           : ErrnoToStatus(errno, "rename to " + args.out);
  partial.Release();
  progress.Finish();
  const std::string parent =
      std::filesystem::absolute(args.out).parent_path().string();
  CKPT_RETURN_IF_ERROR(SyncDir(parent));

  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("out", args.out)
        .Field("job", src->job())
        .Field("step", src->step())
        .Field("from_world_size", src->world_size())
        .Field("world_size", n);
    w.Field("tensors", static_cast<uint64_t>(saved.tensors().size()))
        .Field("sharded_tensors", sharded)
        .Field("bytes", total_bytes)
        .Field("verified", true)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf(
        "resharded job %s step %llu from %u to %u ranks (%zu tensors, %llu "
        "split, the rest on every rank; checksums verified) into %s (%s)\n",
        src->job().c_str(), static_cast<unsigned long long>(src->step()),
        src->world_size(), n, saved.tensors().size(),
        static_cast<unsigned long long>(sharded), args.out.c_str(),
        FormatBytes(total_bytes).c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
