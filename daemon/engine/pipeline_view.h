// PipelineView: the persistence pipeline's view of the job table
// (PipelineState, pipeline.h). Each stage reads what it is to write under
// the table's lock (Snapshot*), does its I/O with no lock held, and
// records the outcome (Record*), which the table's transitions turn into
// effects that NodeState carries out. Also the end of the daemon's life:
// Drain waits for what was committed to become durable.
//
// Thread-safety: every method takes the table's lock itself (callers must
// not hold it) and is safe to call concurrently.
#ifndef CKPT_DAEMON_ENGINE_PIPELINE_VIEW_H_
#define CKPT_DAEMON_ENGINE_PIPELINE_VIEW_H_

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "daemon/pipeline/pipeline.h"
#include "daemon/state/node_state.h"

namespace ckpt::daemon {

class PipelineView : public PipelineState {
 public:
  // `node` must outlive the view.
  explicit PipelineView(NodeState& node) : node_(node) {}

  std::optional<PersistSnapshot> SnapshotPersist(
      const PersistTask& task) override;
  void RecordPersist(const PersistTask& task, PersistOutcome outcome) override;
  std::optional<ManifestSnapshot> SnapshotManifest(const std::string& job,
                                                   uint64_t step, bool object,
                                                   bool* written) override;
  bool RecordManifest(const std::string& job, uint64_t step, bool object,
                      const ManifestSnapshot& m,
                      const absl::Status& status) override;
  absl::StatusOr<UploadSnapshot> SnapshotUpload(
      const UploadTask& task) override;
  bool SlotUnchanged(const UploadTask& task,
                     const UploadSnapshot& snap) override;
  void RecordUpload(const UploadTask& task, const std::string& key,
                    uint64_t bytes, double seconds) override;

  // Refuses new saves from now on and waits until every committed shard is
  // durable (or failed for good) or the deadline passes. Returns how many
  // shards were still not durable.
  size_t Drain(std::chrono::milliseconds deadline);

 private:
  using Section = NodeState::Section;
  using Rank = RankSlots;

  NodeState& node_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_PIPELINE_VIEW_H_
