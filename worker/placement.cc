#include "worker/placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

DeviceFootprint FootprintOf(size_t num_chunks, size_t chunk_elems) {
  return {num_chunks * chunk_elems * kFixedBytesPerElem,
          chunk_elems * kResidentBytesPerElem};
}

absl::Status ValidateOffloadFraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("offload_fraction = ", fraction, ": must be in [0, 1]"));
  }
  return absl::OkStatus();
}

size_t StaticResidentChunks(double offload_fraction, size_t num_chunks) {
  auto offloaded =
      static_cast<size_t>(std::llround(offload_fraction * num_chunks));
  return num_chunks - std::min(offloaded, num_chunks);
}

absl::Status ValidateAutoBudget(uint64_t budget_bytes,
                                const DeviceFootprint& f) {
  if (budget_bytes < f.fixed_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_budget_bytes = ", budget_bytes,
                     ": below the minimum of ", f.fixed_bytes,
                     " bytes (fp32 gradients and bf16 parameters of every "
                     "chunk stay on the device)"));
  }
  return absl::OkStatus();
}

size_t AutoResidentChunks(uint64_t budget_bytes, uint64_t non_model_peak_bytes,
                          const DeviceFootprint& f, size_t num_chunks) {
  if (budget_bytes < f.fixed_bytes) return 0;
  uint64_t room = budget_bytes - f.fixed_bytes;
  if (room <= non_model_peak_bytes || f.resident_chunk_bytes == 0) return 0;
  room -= non_model_peak_bytes;
  return static_cast<size_t>(
      std::min<uint64_t>(room / f.resident_chunk_bytes, num_chunks));
}

}  // namespace ckpt::worker
