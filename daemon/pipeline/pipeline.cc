// The persistence pipeline's stages and their I/O. See pipeline.h; the
// tiers are described in doc/object-tier.md.
#include "daemon/pipeline/pipeline.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <future>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/shard_image.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// Anonymous memory of the daemon's own, page-aligned (direct I/O reads into
// it), unmapped on destruction.
class PrivateBuffer {
 public:
  static absl::StatusOr<PrivateBuffer> Allocate(uint64_t bytes) {
    PrivateBuffer b;
    if (bytes == 0) return b;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return ErrnoToStatus(errno, absl::StrCat("mmap ", bytes, " bytes"));
    b.data_ = static_cast<char*>(p);
    b.bytes_ = bytes;
    return b;
  }
  PrivateBuffer() = default;
  PrivateBuffer(PrivateBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  PrivateBuffer& operator=(PrivateBuffer&&) = delete;
  ~PrivateBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// One object from memory: the writer reads the bytes in place.
absl::Status PutObject(storage::Backend& backend, const std::string& key,
                       const char* data, uint64_t bytes) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectWriter> writer,
                        backend.NewObjectWriter(key, bytes));
  absl::Status s = writer->WriteAt(0, data, bytes);
  if (s.ok()) return writer->Commit();
  writer->Abort();
  return s;
}

}  // namespace

PersistPipeline::PersistPipeline(PipelineState* state, storage::Backend* local,
                                 storage::Backend* object,
                                 unsigned upload_threads, Catalog* catalog,
                                 CatalogWriter* writer, std::string node_id,
                                 const DaemonClock* clock)
    : state_(state),
      local_(local),
      object_(object),
      node_id_(std::move(node_id)),
      persister_(
          local,
          [this](const PersistTask& task) {
            if (task.kind == PersistTask::kShard)
              PersistShard(task);
            else
              WriteManifest(task);
          },
          catalog, writer, clock) {
  if (object != nullptr)
    uploader_ = std::make_unique<Uploader>(
        object, upload_threads,
        [this](const UploadTask& task) {
          return task.kind == UploadTask::kShard ? UploadShard(task)
                                                 : WriteObjectManifest(task);
        },
        catalog, writer, clock);
}

PersistPipeline::~PersistPipeline() { Stop(); }

void PersistPipeline::Start() {
  persister_.Start();
  if (uploader_) uploader_->Start();
}

void PersistPipeline::Stop() {
  if (uploader_) uploader_->Stop();
  persister_.Stop();
}

void PersistPipeline::PersistShard(const PersistTask& task) {
  std::optional<PersistSnapshot> snap = state_->SnapshotPersist(task);
  if (!snap) return;
  char* const image = snap->image;
  storage::ShardInfo& info = snap->info;
  absl::Status s;
  bool computed = false;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (snap->known[i]) continue;  // device tensors: the CPU never saw them
    info.tensors[i].checksum =
        TensorChecksum(image + info.tensors[i].offset, info.tensors[i].bytes);
    computed = true;
  }
  if (computed)
    s = storage::EncodeShardMetadata(
        info, std::span<char>(image, info.layout.image_bytes));
  const std::string& key = snap->key;
  const auto write_start = std::chrono::steady_clock::now();
  if (s.ok()) {
    // The checksum pass runs on another core while the write is in flight.
    // A mismatch means the slot changed after the commit.
    auto verify = std::async(std::launch::async, [&] {
      return storage::VerifyTensorChecksums(
          image, info, absl::StrCat(key, " in shared memory"), snap->known);
    });
    // The job's uid owns its shards, so its trainers can read them directly.
    storage::WriterOptions wo;
    wo.owner_uid = snap->owner_uid;
    auto writer = local_->NewObjectWriter(key, info.layout.image_bytes, wo);
    s = writer.status();
    // In pieces, so the watchdog sees a long write advance (the writer keeps
    // its queue full across calls).
    constexpr uint64_t kPiece = 256ull << 20;
    for (uint64_t off = 0; s.ok() && off < info.layout.image_bytes;
         off += kPiece) {
      s = (*writer)->WriteAt(off, image + off,
                             std::min(kPiece, info.layout.image_bytes - off));
      persister_.NoteProgress();
    }
    absl::Status v = verify.get();
    if (s.ok()) s = v;
    // The job's uid may have truncated the arena meanwhile: what was read
    // then is zeros (or the write failed), and the error to report is the
    // arena's, whatever the symptom.
    if (absl::Status a = snap->arena->CheckIntact(); !a.ok()) s = a;
    if (s.ok())
      s = (*writer)->Commit();
    else if (writer.ok())
      (*writer)->Abort();
  } else if (absl::Status a = snap->arena->CheckIntact(); !a.ok()) {
    s = a;
  }
  PersistOutcome outcome;
  outcome.status = std::move(s);
  outcome.info = std::move(info);
  outcome.image = image;
  outcome.seconds = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - write_start)
                        .count();
  state_->RecordPersist(task, std::move(outcome));
}

namespace {

// The layout index of the snapshot's metas into its manifest (none: the
// step has no layout). The metas passed the commit's checks; an index
// that still does not build (two ranks declaring one global tensor with
// two shapes) is logged and the manifest written without it.
void AddLayoutIndex(ManifestSnapshot& m) {
  if (m.metas.empty()) return;
  absl::StatusOr<storage::LayoutIndex> index =
      storage::BuildLayoutIndex(static_cast<uint32_t>(m.metas.size()), m.metas);
  if (!index.ok()) {
    LogWarning(absl::StrCat("layout index of ", m.manifest.job(), " step ",
                            m.manifest.step(), ": ", index.status().message(),
                            "; the manifest goes without it"));
    return;
  }
  m.manifest.set_layout_index(storage::SerializeLayoutIndex(*index));
}

}  // namespace

void PersistPipeline::WriteManifest(const PersistTask& task) {
  const std::string key = storage::ManifestKey(task.job, task.step, node_id_);
  // Built under the state's lock, written without it: a shard that changes
  // meanwhile (a re-save, a drop) saw no manifest to delete, so the one
  // written then is deleted here, and the step written again if whole.
  for (;;) {
    bool written = false;
    std::optional<ManifestSnapshot> m = state_->SnapshotManifest(
        task.job, task.step, /*object=*/false, &written);
    if (!m) return;
    AddLayoutIndex(*m);
    absl::Status s = storage::WriteNodeManifest(*local_, m->manifest, node_id_);
    if (state_->RecordManifest(task.job, task.step, /*object=*/false, *m, s) ||
        !s.ok())
      return;
    absl::Status d = local_->Delete(key);
    if (!d.ok()) {
      // Left for the next write of the step's manifest to replace.
      LogWarning(absl::StrCat("stale manifest ", key, ": ", d.message()));
      return;
    }
  }
}

absl::Status PersistPipeline::UploadShard(const UploadTask& task) {
  CKPT_ASSIGN_OR_RETURN(UploadSnapshot snap, state_->SnapshotUpload(task));
  const auto t0 = std::chrono::steady_clock::now();
  bool done = false;
  if (snap.arena != nullptr && snap.write_no != 0) {
    // No lease: a save may take the slot meanwhile (uploads never block
    // saves). The shared_ptr keeps the mapping; write_no says afterwards
    // whether the bytes stayed the shard's. The object is invisible until
    // the step's object manifest, which waits for `uploaded`.
    const char* bytes = snap.arena->slot_data(snap.slot);
    absl::Status s = PutObject(*object_, snap.key, bytes, snap.bytes);
    // The job's uid may truncate the arena: its shard is durable in the
    // local file, which is sent instead.
    absl::Status intact = snap.arena->CheckIntact();
    if (!s.ok() && intact.ok()) return Annotate(s, "upload from shared memory");
    // The job's processes can still write to the slot, so the bytes sent
    // must be checked against the shard's checksums after the writer read
    // them; a stray write sends the verified local file instead.
    absl::Status verified =
        s.ok() ? storage::VerifyTensorChecksums(bytes, snap.info, snap.key) : s;
    if (intact.ok()) intact = snap.arena->CheckIntact();
    done = state_->SlotUnchanged(task, snap);
    if (done && !intact.ok()) {
      LogWarning(absl::StrCat("upload of ", snap.key, ": ", intact.message(),
                              "; uploading the local file"));
      done = false;
    } else if (done && !verified.ok()) {
      LogWarning(absl::StrCat(
          "upload of ", snap.key, ": shared memory changed after the commit (",
          verified.message(), "); uploading the local file"));
      done = false;
    }
  }
  if (!done)
    CKPT_RETURN_IF_ERROR(UploadFromLocalFile(snap.key, snap.bytes, snap.info));
  const double upload_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  uploader_->CountUploaded(snap.bytes, upload_s);
  state_->RecordUpload(task, snap.key, snap.bytes, upload_s);
  return absl::OkStatus();
}

absl::Status PersistPipeline::UploadFromLocalFile(
    const std::string& key, uint64_t bytes, const storage::ShardInfo& info) {
  // The file belongs to the job's uid, who may truncate or rewrite it at
  // any time. A mapping of it would turn a short file into SIGBUS in the
  // daemon, so it is read into the daemon's own memory (a short file is an
  // error naming it), and the bytes verified are the bytes sent.
  const std::string where = local_->LocalPath(key).value_or(key);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                        local_->NewObjectReader(key));
  if (reader->size() != bytes)
    return absl::DataLossError(absl::StrCat(
        where, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
  CKPT_ASSIGN_OR_RETURN(PrivateBuffer buf, PrivateBuffer::Allocate(bytes));
  CKPT_RETURN_IF_ERROR(reader->ReadAt(0, buf.data(), bytes));
  reader.reset();
  // The checksum pass runs beside the upload; a bad local file is not sent.
  auto verify = std::async(std::launch::async, [&] {
    return storage::VerifyTensorChecksums(buf.data(), info, where);
  });
  auto writer = object_->NewObjectWriter(key, bytes);
  absl::Status s = writer.status();
  if (s.ok()) s = (*writer)->WriteAt(0, buf.data(), bytes);
  absl::Status v = verify.get();
  if (s.ok()) s = v;
  if (s.ok())
    s = (*writer)->Commit();
  else if (writer.ok())
    (*writer)->Abort();
  return Annotate(s, "upload from the local file");
}

absl::Status PersistPipeline::WriteObjectManifest(const UploadTask& task) {
  const std::string key = storage::ManifestKey(task.job, task.step, node_id_);
  // Built under the state's lock, written without it. Only this task
  // touches the key now (uploader.h), so a manifest that no longer
  // describes the step (it changed or went while the task waited or wrote)
  // is deleted here, and the step's current state written if it is whole.
  for (;;) {
    bool written = false;
    std::optional<ManifestSnapshot> m = state_->SnapshotManifest(
        task.job, task.step, /*object=*/true, &written);
    if (written) return absl::CancelledError("manifest already written");
    if (!m) {
      CKPT_RETURN_IF_ERROR(object_->Delete(key));
      return absl::CancelledError("step gone, incomplete or not uploaded");
    }
    AddLayoutIndex(*m);
    // Written last: only now is the step visible in the object tier.
    CKPT_RETURN_IF_ERROR(
        storage::WriteNodeManifest(*object_, m->manifest, node_id_));
    if (state_->RecordManifest(task.job, task.step, /*object=*/true, *m,
                               absl::OkStatus()))
      return absl::OkStatus();
  }
}

}  // namespace ckpt::daemon
