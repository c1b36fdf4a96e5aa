// The object tier: uploads (from the slot while it still holds the shard,
// else from the local file), object manifests, tiered retention and reads
// back. See engine.h and uploader.h; the tiers are described in
// doc/object-tier.md.
#include <sys/mman.h>

#include <cerrno>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_image.h"
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

std::optional<UploadBacklog> Engine::ObjectBacklog() const {
  if (!uploader_) return std::nullopt;
  return uploader_->Backlog();
}

void Engine::QueueUploadLocked(const Job& job, const Shard& shard) {
  if (shard.uploaded || shard.phase != ShardPhase::kDurable) return;
  UploadTask t{UploadTask::kShard, job.rec.job(), shard.rec.step(),
               shard.rec.rank(),   shard.gen,     shard.rec.image_bytes(),
               {shard.rec.path()}};
  uploader_->Push(std::move(t));
}

absl::Status Engine::UploadShard(const UploadTask& task) {
  std::shared_ptr<shm::Arena> arena;
  int slot = -1;
  uint64_t write_no = 0;
  std::string key;
  uint64_t bytes = 0;
  storage::ShardInfo info;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Shard* shard = FindShardLocked(task.job, task.step, task.rank);
    if (shard == nullptr || shard->gen != task.gen ||
        shard->phase != ShardPhase::kDurable || shard->uploaded)
      return absl::CancelledError("no longer wanted");
    key = shard->rec.path();
    bytes = shard->rec.image_bytes();
    info = shard->info;
    if (shard->slot >= 0) {
      const Rank& rank = jobs_.find(task.job)->second.ranks[task.rank];
      arena = rank.arena;
      slot = shard->slot;
      write_no = rank.slots[slot].write_no;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s;
  bool done = false;
  if (arena != nullptr && write_no != 0) {
    // No lease: a save may take the slot meanwhile (uploads never block
    // saves). The shared_ptr keeps the mapping; write_no says afterwards
    // whether the bytes stayed the shard's. The object is invisible until
    // the step's object manifest, which waits for `uploaded`.
    s = PutObject(*object_, key, arena->slot_data(slot), bytes);
    if (!s.ok()) return Annotate(s, "upload from shared memory");
    // The job's processes can still write to the slot, so the bytes sent
    // must be checked against the shard's checksums after the writer read
    // them; a stray write sends the verified local file instead.
    absl::Status verified =
        storage::VerifyTensorChecksums(arena->slot_data(slot), info, key);
    std::lock_guard<std::mutex> lock(mu_);
    auto job = jobs_.find(task.job);
    if (job != jobs_.end()) {
      auto rank = job->second.ranks.find(task.rank);
      done = rank != job->second.ranks.end() && rank->second.arena == arena &&
             rank->second.slots[slot].write_no == write_no;
    }
    if (done && !verified.ok()) {
      LogWarning(absl::StrCat(
          "upload of ", key, ": shared memory changed after the commit (",
          verified.message(), "); uploading the local file"));
      done = false;
    }
  }
  if (!done) CKPT_RETURN_IF_ERROR(UploadFromLocalFile(key, bytes, info));

  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
  const double upload_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  uploader_->CountUploaded(bytes, upload_s);
  metrics_->Persisted(metric::kTierObject, upload_s, bytes);
  Shard* shard = FindShardLocked(task.job, task.step, task.rank);
  if (shard == nullptr || shard->gen != task.gen) {
    // Deleted or replaced while we uploaded: the object must not outlive it.
    if (shard == nullptr)
      QueueObjectDeleteTaskLocked(
          UploadTask{UploadTask::kDelete, task.job, task.step, 0, 0, 0, {key}});
    return absl::OkStatus();
  }
  shard->uploaded = true;
  shard->rec.set_uploaded(true);
  CatalogEdit edit;
  edit.PutShard(shard->rec);
  RecordLocked(std::move(edit), /*sync=*/false);
  Job& job = jobs_.find(task.job)->second;
  if (ObjectCommit()) ReportLocked(*shard, /*durable=*/true);
  MaybeQueueObjectManifestLocked(job, task.step);
  return absl::OkStatus();
}

absl::Status Engine::UploadFromLocalFile(const std::string& key, uint64_t bytes,
                                         const storage::ShardInfo& info) {
  // The file belongs to the job's uid, who may truncate or rewrite it at
  // any time. A mapping of it would turn a short file into SIGBUS in the
  // daemon, so it is read into the daemon's own memory (a short file is an
  // error naming it), and the bytes verified are the bytes sent.
  const std::string where = backend_->LocalPath(key).value_or(key);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                        backend_->NewObjectReader(key));
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

void Engine::MaybeQueueObjectManifestLocked(Job& job, uint64_t step_no) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end() || step->second.object_manifest) return;
  bool durable = false;
  if (!StepCompleteLocked(job, step->second, &durable) || !durable) return;
  for (const auto& [r, shard] : step->second.shards)
    if (!shard.uploaded) return;
  QueueObjectManifestTaskLocked(job.rec.job(), step_no);
}

void Engine::QueueObjectManifestTaskLocked(const std::string& job,
                                           uint64_t step_no) {
  uploader_->Push(UploadTask{UploadTask::kManifest,
                             job,
                             step_no,
                             0,
                             0,
                             0,
                             {NodeManifestKey(job, step_no)}});
}

absl::Status Engine::WriteObjectManifest(const UploadTask& task) {
  const std::string key = NodeManifestKey(task.job, task.step);
  // Built under the lock, written without it. Only this task touches the
  // key now (uploader.h), so a manifest that no longer describes the step
  // (it changed or went while the task waited or wrote) is deleted here,
  // and the step's current state written if it is whole.
  for (;;) {
    std::optional<storage::v1::NodeManifest> m;
    std::vector<std::pair<uint32_t, uint64_t>> gens;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Job* job = nullptr;
      Step* step = nullptr;
      if (auto j = jobs_.find(task.job); j != jobs_.end()) {
        job = &j->second;
        if (auto st = job->steps.find(task.step); st != job->steps.end())
          step = &st->second;
      }
      if (step != nullptr && step->object_manifest)
        return absl::CancelledError("manifest already written");
      bool durable = false, uploaded = step != nullptr;
      if (step != nullptr)
        for (const auto& [r, shard] : step->shards)
          uploaded = uploaded && shard.uploaded;
      if (uploaded && StepCompleteLocked(*job, *step, &durable) && durable) {
        m = NodeManifestOf(task.job, task.step, job->rec.world_size(), *step);
        gens = ShardGenerations(*step);
      }
    }
    if (!m) {
      CKPT_RETURN_IF_ERROR(object_->Delete(key));
      return absl::CancelledError("step gone, incomplete or not uploaded");
    }
    // Written last: only now is the step visible in the object tier.
    CKPT_RETURN_IF_ERROR(
        storage::WriteNodeManifest(*object_, *m, options_.node_id));
    std::lock_guard<std::mutex> lock(mu_);
    auto job = jobs_.find(task.job);
    if (job == jobs_.end()) continue;
    auto step = job->second.steps.find(task.step);
    if (step == job->second.steps.end() ||
        ShardGenerations(step->second) != gens)
      continue;
    step->second.object_manifest = true;
    ApplyRetentionLocked(job->second);
    cv_.notify_all();
    return absl::OkStatus();
  }
}

void Engine::QueueObjectDeleteLocked(Job& job, uint64_t step_no) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return;
  UploadTask del{UploadTask::kDelete, job.rec.job(), step_no};
  // The manifest goes whether or not this daemon saw it written: an upload
  // that raced a delete must not leave a visible step.
  del.keys.push_back(NodeManifestKey(job.rec.job(), step_no));
  for (const auto& [r, shard] : step->second.shards)
    if (shard.uploaded) del.keys.push_back(shard.rec.path());
  QueueObjectDeleteTaskLocked(std::move(del));
  step->second.object_manifest = false;
  for (auto& [r, shard] : step->second.shards) shard.uploaded = false;
}

void Engine::DropLocalCopyLocked(Job& job, uint64_t step_no) {
  Step& step = job.steps[step_no];
  if (step.manifest) {
    QueueLocalDeleteLocked(job.rec.job(), step_no,
                           NodeManifestKey(job.rec.job(), step_no), false);
    step.manifest = false;
  }
  for (auto& [r, shard] : step.shards) {
    if (shard.local_gone || shard.phase != ShardPhase::kDurable) continue;
    QueueLocalDeleteLocked(job.rec.job(), step_no, shard.rec.path(), false);
    shard.local_gone = true;
    shard.rec.set_local_gone(true);
    CatalogEdit edit;
    edit.PutShard(shard.rec);
    RecordLocked(std::move(edit), /*sync=*/false);
  }
}

void Engine::ApplyTieredRetentionLocked(Job& job, const Hosting* hosting) {
  const bool cluster = !options_.node_id.empty();
  // The object tier first: whole steps go, object manifest first.
  std::optional<uint64_t> object_cutoff = RetentionCutoff(
      job.steps, options_.retain_object, cluster, hosting, /*object=*/true);
  std::vector<uint64_t> doomed, local_only;
  for (const auto& [n, step] : job.steps)
    if (object_cutoff && n < *object_cutoff) doomed.push_back(n);
  for (uint64_t n : doomed) {
    QueueObjectDeleteLocked(job, n);
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job.steps[n].shards) ranks.push_back(r);
    for (uint32_t r : ranks) DropShardLocked(job, n, r, /*delete_file=*/true);
  }
  // Steps that can never be whole (a shard failed for good) count in
  // neither tier's retain: without this they would fill both.
  for (uint64_t n :
       BrokenStepsToDrop(job.steps, options_.retain_steps, hosting)) {
    QueueObjectDeleteLocked(job, n);
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job.steps[n].shards) ranks.push_back(r);
    for (uint32_t r : ranks) DropShardLocked(job, n, r, /*delete_file=*/true);
  }
  // Then the local tier: a step's local copy goes once the step is in the
  // object tier; a complete step still uploading keeps it (the upload may
  // need the file); an incomplete or failed one goes as without tiers.
  std::optional<uint64_t> local_cutoff = RetentionCutoff(
      job.steps, options_.retain_steps, cluster, hosting, /*object=*/false);
  if (!local_cutoff) return;
  std::vector<uint64_t> drop_whole;
  for (auto& [n, step] : job.steps) {
    if (n >= *local_cutoff) break;
    bool durable = false;
    // Only a copy the object tier holds may go.
    bool uploaded = step.object_manifest;
    for (const auto& [r, shard] : step.shards)
      uploaded = uploaded && shard.uploaded;
    if (uploaded)
      local_only.push_back(n);
    else if (!StepCompleteLocked(job, step, &durable))
      drop_whole.push_back(n);
  }
  for (uint64_t n : local_only) DropLocalCopyLocked(job, n);
  for (uint64_t n : drop_whole) {
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job.steps[n].shards) ranks.push_back(r);
    for (uint32_t r : ranks) DropShardLocked(job, n, r, /*delete_file=*/true);
  }
}

absl::Status Engine::ReadShardImage(const std::string& key, bool local,
                                    bool object, const storage::ShardInfo& info,
                                    char* dst, uint64_t bytes,
                                    bool* from_object) {
  auto read = [&](storage::Backend& b) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          b.NewObjectReader(key));
    if (reader->size() != bytes)
      return absl::DataLossError(absl::StrCat(
          key, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
    return reader->ReadAt(0, dst, bytes);
  };
  *from_object = false;
  absl::Status s = absl::NotFoundError(key + ": no local copy");
  if (local) s = read(*backend_);
  if (s.ok() || !object) return s;
  if (local)
    LogWarning(absl::StrCat("load ", key, ": local copy unreadable (",
                            s.message(), "); reading the object tier"));
  *from_object = true;
  auto t0 = std::chrono::steady_clock::now();
  s = read(*object_);
  auto t1 = std::chrono::steady_clock::now();
  if (s.ok()) s = storage::VerifyTensorChecksums(dst, info, key);
  LogInfo(absl::StrFormat(
      "load %s from the object tier: GETs %.3f s, checksums %.3f s", key,
      std::chrono::duration<double>(t1 - t0).count(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1)
          .count()));
  return Annotate(s, absl::StrCat("object tier (", object_->name(), ")"));
}

}  // namespace ckpt::daemon
