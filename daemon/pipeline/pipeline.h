// PersistPipeline: the storage side of a save, one stage after another —
// persist (a staged slot to the local tier), this node's manifest of a
// step, then, with an object tier, upload and the object manifest — and
// the deletes the daemon owes storage. It owns the queues and threads of
// these stages (the Persister and the Uploader) and all of their I/O.
//
// It sees the daemon's state only through PipelineState: each task starts
// with a Snapshot (what to write, taken under the state's lock) and ends
// with a Record of its outcome (applied under it); the pipeline holds no
// state lock while it writes, and never reaches into the state otherwise.
// The state queues work through Persist()/Upload() (their Push and
// QueueDelete); each queue has its own lock (persister.h, uploader.h), so
// the state may queue with its lock held.
//
// Thread-safety: as the Persister's and the Uploader's; the PipelineState
// methods are called from their threads without the state lock held.
#ifndef CKPT_DAEMON_PIPELINE_PIPELINE_H_
#define CKPT_DAEMON_PIPELINE_PIPELINE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ckpt.pb.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/clock.h"
#include "daemon/pipeline/persister.h"
#include "daemon/pipeline/uploader.h"
#include "manifest.pb.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

// What a shard's persist writes.
struct PersistSnapshot {
  char* image = nullptr;  // the slot (kPersisting while the task runs)
  std::shared_ptr<shm::Arena> arena;  // holds `image`
  storage::ShardInfo info;            // validated at commit
  std::vector<bool> known;            // the checksums the client computed
  uint32_t owner_uid = 0;             // owns the file (the job's uid)
  std::string key;
};
struct PersistOutcome {
  absl::Status status;
  storage::ShardInfo info;  // with the device tensors' checksums
  char* image = nullptr;
  double seconds = 0;  // the write
};
// A node manifest of a step, and the shard generations it describes.
struct ManifestSnapshot {
  storage::v1::NodeManifest manifest;
  std::vector<std::pair<uint32_t, uint64_t>> gens;
  // When a tensor of the step has a layout: every rank's tensor metadata
  // (metas[r], empty for ranks not on this node), from which the writer
  // builds the manifest's layout index outside the state's lock.
  std::vector<std::vector<v1::TensorMeta>> metas;
};
// What a shard's upload sends: from the slot while it holds the shard
// (write_no says afterwards whether a save overwrote it), else the file.
struct UploadSnapshot {
  std::string key;
  uint64_t bytes = 0;
  storage::ShardInfo info;
  std::shared_ptr<shm::Arena> arena;  // null: from the local file
  int slot = -1;
  uint64_t write_no = 0;
};

class PipelineState {
 public:
  virtual ~PipelineState() = default;
  // nullopt: nothing to write now (the shard went, changed or waits).
  virtual std::optional<PersistSnapshot> SnapshotPersist(
      const PersistTask& task) = 0;
  virtual void RecordPersist(const PersistTask& task,
                             PersistOutcome outcome) = 0;
  // The step's manifest for the local (object: the object) tier; nullopt
  // when the step is not whole and durable there, or the manifest is
  // written already (*written then says so).
  virtual std::optional<ManifestSnapshot> SnapshotManifest(
      const std::string& job, uint64_t step, bool object, bool* written) = 0;
  // The manifest of `m.gens` was written (or failed: `status`). True when
  // it still describes the step (recorded); false: the pipeline deletes
  // it and builds it again.
  virtual bool RecordManifest(const std::string& job, uint64_t step,
                              bool object, const ManifestSnapshot& m,
                              const absl::Status& status) = 0;
  // Cancelled when the upload is no longer wanted.
  virtual absl::StatusOr<UploadSnapshot> SnapshotUpload(
      const UploadTask& task) = 0;
  // Whether the slot still holds the bytes the upload read.
  virtual bool SlotUnchanged(const UploadTask& task,
                             const UploadSnapshot& snap) = 0;
  virtual void RecordUpload(const UploadTask& task, const std::string& key,
                            uint64_t bytes, double seconds) = 0;
};

class PersistPipeline {
 public:
  // Every pointer must outlive the pipeline; object may be null (no object
  // tier). The queues' retries are timed on `clock` (null: the real one).
  PersistPipeline(PipelineState* state, storage::Backend* local,
                  storage::Backend* object, unsigned upload_threads,
                  Catalog* catalog, CatalogWriter* writer, std::string node_id,
                  const DaemonClock* clock = nullptr);
  PersistPipeline(const PersistPipeline&) = delete;
  PersistPipeline& operator=(const PersistPipeline&) = delete;
  ~PersistPipeline();  // Stop()

  void Start();
  // Waits for the running tasks, which take the state's lock (Snapshot,
  // Record): callers must not hold it.
  void Stop();

  Persister& persist() { return persister_; }
  Uploader* upload() { return uploader_.get(); }  // null without the tier

 private:
  void PersistShard(const PersistTask& task);
  void WriteManifest(const PersistTask& task);
  [[nodiscard]] absl::Status UploadShard(const UploadTask& task);
  [[nodiscard]] absl::Status UploadFromLocalFile(
      const std::string& key, uint64_t bytes, const storage::ShardInfo& info);
  [[nodiscard]] absl::Status WriteObjectManifest(const UploadTask& task);

  PipelineState* const state_;
  storage::Backend* const local_;
  storage::Backend* const object_;
  const std::string node_id_;
  Persister persister_;
  std::unique_ptr<Uploader> uploader_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PIPELINE_PIPELINE_H_
