// The shard lifecycle's transitions and mappings. See shard_phase.h.
#include "daemon/core/shard_phase.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/core/step_state.h"
#include "storage/manifest.h"

namespace ckpt::daemon {

const char* ShardPhaseName(ShardPhase phase) {
  switch (phase) {
    case ShardPhase::kStaged:
      return "staged";
    case ShardPhase::kPersisting:
      return "persisting";
    case ShardPhase::kDurable:
      return "durable";
    case ShardPhase::kFailed:
      return "failed";
  }
  return "?";
}

bool LegalTransition(ShardPhase from, ShardPhase to) {
  switch (from) {
    case ShardPhase::kStaged:
      return to == ShardPhase::kPersisting || to == ShardPhase::kDurable ||
             to == ShardPhase::kFailed;
    case ShardPhase::kPersisting:
      return to == ShardPhase::kStaged || to == ShardPhase::kDurable ||
             to == ShardPhase::kFailed;
    case ShardPhase::kDurable:
      return to == ShardPhase::kFailed;
    case ShardPhase::kFailed:
      return false;
  }
  return false;
}

shm::SlotState SlotStateOf(ShardPhase phase) {
  switch (phase) {
    case ShardPhase::kStaged:
    case ShardPhase::kFailed:
      return shm::SlotState::kStaged;
    case ShardPhase::kPersisting:
      return shm::SlotState::kPersisting;
    case ShardPhase::kDurable:
      return shm::SlotState::kDurable;
  }
  return shm::SlotState::kStaged;
}

catv1::ShardRecord::State CatalogStateOf(ShardPhase phase) {
  switch (phase) {
    case ShardPhase::kStaged:
    case ShardPhase::kPersisting:
      return catv1::ShardRecord::STAGED;
    case ShardPhase::kDurable:
      return catv1::ShardRecord::DURABLE;
    case ShardPhase::kFailed:
      return catv1::ShardRecord::FAILED;
  }
  return catv1::ShardRecord::UNKNOWN;
}

ShardPhase PhaseOfRecord(catv1::ShardRecord::State state) {
  return state == catv1::ShardRecord::DURABLE ? ShardPhase::kDurable
                                              : ShardPhase::kStaged;
}

v1::SlotState RpcSlotStateOf(shm::SlotState state) {
  switch (state) {
    case shm::SlotState::kFree:
      return v1::SLOT_STATE_FREE;
    case shm::SlotState::kWriting:
      return v1::SLOT_STATE_WRITING;
    case shm::SlotState::kStaged:
      return v1::SLOT_STATE_STAGED;
    case shm::SlotState::kPersisting:
      return v1::SLOT_STATE_PERSISTING;
    case shm::SlotState::kDurable:
      return v1::SLOT_STATE_DURABLE;
  }
  return v1::SLOT_STATE_FREE;
}

v1::ShardState RpcStateOf(ShardPhase phase) {
  switch (phase) {
    case ShardPhase::kStaged:
      return v1::SHARD_STATE_STAGED;
    case ShardPhase::kPersisting:
      return v1::SHARD_STATE_PERSISTING;
    case ShardPhase::kDurable:
      return v1::SHARD_STATE_DURABLE;
    case ShardPhase::kFailed:
      return v1::SHARD_STATE_FAILED;
  }
  return v1::SHARD_STATE_UNSPECIFIED;
}

void Shard::Start(ShardPhase first) {
  phase = first;
  rec.set_state(CatalogStateOf(first));
}

bool Shard::MoveTo(ShardPhase to) {
  if (!LegalTransition(phase, to)) {
    LogWarning(absl::StrCat("job ", rec.job(), " step ", rec.step(), " rank ",
                            rec.rank(), ": refused shard transition ",
                            ShardPhaseName(phase), " -> ", ShardPhaseName(to)));
    return false;
  }
  phase = to;
  rec.set_state(CatalogStateOf(to));
  return true;
}

PersistVerdict PersistVerdictOf(bool mine, bool key_in_use,
                                absl::StatusCode code, uint32_t failed_attempts,
                                const PersistRetryPolicy& policy) {
  PersistVerdict v;
  const bool ok = code == absl::StatusCode::kOk;
  if (!mine) {
    v.kind = PersistVerdict::kOrphan;
    v.delete_file = ok && !key_in_use;
    return v;
  }
  if (ok) {
    v.kind = PersistVerdict::kDurable;
    return v;
  }
  if (code == absl::StatusCode::kDataLoss) {
    v.kind = PersistVerdict::kAbandon;
    return v;
  }
  v.kind = PersistVerdict::kRetry;
  v.release_slot = failed_attempts >= policy.max_attempts;
  const uint32_t doublings = failed_attempts == 0 ? 0 : failed_attempts - 1;
  v.retry_after = std::min(policy.delay * (1u << std::min(doublings, 16u)),
                           std::max(policy.max_delay, policy.delay));
  return v;
}

RestoreCopy RestoreCopyOf(const Shard& shard, bool client_may_read_file) {
  if (shard.slot >= 0) return RestoreCopy::kSlot;
  if (shard.phase != ShardPhase::kDurable) return RestoreCopy::kLost;
  if (client_may_read_file && !shard.local_gone)
    return RestoreCopy::kFileIfReadable;
  return RestoreCopy::kLoad;
}

bool IsOrderedSave(const Shard& have, uint32_t world_size,
                   std::span<const uint64_t> save_digests) {
  if (have.rec.world_size() != world_size) return false;
  if (save_digests.empty()) return true;
  auto named = [&](uint64_t digest) {
    return std::find(save_digests.begin(), save_digests.end(), digest) !=
           save_digests.end();
  };
  return named(storage::ChecksumsDigest(have.info)) ||
         (have.staged_digest && named(*have.staged_digest));
}

}  // namespace ckpt::daemon
