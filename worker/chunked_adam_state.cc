// Direct access to the fp32 master state, for checkpoints.
#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "worker/chunked_adam.h"

namespace ckpt::worker {

absl::StatusOr<ChunkedAdam::MasterState> ChunkedAdam::MasterStateOf(
    size_t tensor) const {
  if (tensor >= tensors_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MasterStateOf: tensor index ", tensor, " out of range (",
                     tensors_.size(), ")"));
  }
  const TensorSlot& slot = layout_.slots[tensor];
  const Chunk& c = chunks_[slot.chunk];
  if (c.dev_p != nullptr) {
    return MasterState{c.dev_p + slot.offset, c.dev_m + slot.offset,
                       c.dev_v + slot.offset, true};
  }
  return MasterState{c.host_p + slot.offset, c.host_m + slot.offset,
                     c.host_v + slot.offset, false};
}

absl::Status ChunkedAdam::ReloadMasterState(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReloadMasterState: step ", step, " < 0"));
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = chunks_[i];
    const size_t n = layout_.chunk_elems;
    const size_t used = layout_.chunk_used[i];
    if (c.dev_p != nullptr) {  // the device copy is the master: bring it home
      CKPT_RETURN_IF_ERROR(device_->CopyToHostAsync(Queue::kDownload, c.host_p,
                                                    c.dev_p, 12 * n));
      CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kDownload));
    }
    for (size_t j = 0; j < used; ++j) c.host_bf16[j] = FloatToBf16(c.host_p[j]);
    CKPT_RETURN_IF_ERROR(device_->CopyToDeviceAsync(Queue::kUpload, c.dev_bf16,
                                                    c.host_bf16, 2 * used));
    CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kUpload));
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace ckpt::worker
