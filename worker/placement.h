// Where each chunk's master state (fp32 p, m, v) lives. Every chunk always
// keeps its fp32 gradient and bf16 working parameters on the device (the model
// computes with them); a device-resident chunk adds its fp32 p, m and v there
// and is updated by the device's Adam, an offloaded one is updated by CPU Adam.
// Resident chunks are always a prefix [0, k) of the chunk list.
//   static: k = num_chunks - round(offload_fraction * num_chunks).
//   auto:   k = the most chunks whose state fits under the budget after the
//           fixed per-chunk bytes and the peak non-model memory of the last
//           iteration (activations, workspace) are set aside.
// Pure functions; thread-safe.
#ifndef CKPT_WORKER_PLACEMENT_H_
#define CKPT_WORKER_PLACEMENT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace ckpt::worker {

enum class PlacementPolicy { kStatic, kAuto };

// Device bytes per chunk element: always (fp32 grad + bf16 params), and in
// addition when resident (fp32 p, m, v).
inline constexpr uint64_t kFixedBytesPerElem = 4 + 2;
inline constexpr uint64_t kResidentBytesPerElem = 4 + 4 + 4;

struct DeviceFootprint {
  uint64_t fixed_bytes = 0;           // all chunks' grad + bf16 buffers
  uint64_t resident_chunk_bytes = 0;  // p, m, v of one chunk
};

DeviceFootprint FootprintOf(size_t num_chunks, size_t chunk_elems);

// InvalidArgument unless 0 <= fraction <= 1 (NaN refused).
[[nodiscard]] absl::Status ValidateOffloadFraction(double fraction);
size_t StaticResidentChunks(double offload_fraction, size_t num_chunks);

// InvalidArgument when the budget cannot even hold the fixed bytes.
[[nodiscard]] absl::Status ValidateAutoBudget(uint64_t budget_bytes,
                                              const DeviceFootprint& f);
size_t AutoResidentChunks(uint64_t budget_bytes, uint64_t non_model_peak_bytes,
                          const DeviceFootprint& f, size_t num_chunks);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_PLACEMENT_H_
