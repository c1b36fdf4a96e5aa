// ChunkedAdam: mixed-precision AdamW whose parameters, gradients and state
// live in fixed-size chunks (see chunk_layout.h), each chunk's master state on
// the device or offloaded to host memory (see placement.h).
//
// A step updates resident chunks with the device's fused Adam on the compute
// queue and, at the same time, runs a three-stage pipeline over offloaded
// chunks: gradient download of chunk i (download queue), CPU Adam of chunk i-1
// (the calling thread plus CpuAdam's pool), and upload of the bf16 parameters
// of chunk i-2 (upload queue). Every chunk has its own host buffers, so no
// stage waits for a buffer to come free. With overlap off the stages run one
// after another (the baseline).
//
// The caller must have finished writing gradients into the device gradient
// buffers before Step. The device must outlive the optimizer. Not
// thread-safe: one thread drives a ChunkedAdam.
#ifndef CKPT_WORKER_CHUNKED_ADAM_H_
#define CKPT_WORKER_CHUNKED_ADAM_H_

#include <memory>
#include <span>
#include <vector>

#include "worker/chunk_layout.h"
#include "worker/cpu_adam.h"
#include "worker/device.h"
#include "worker/placement.h"

namespace ckpt::worker {

struct ChunkedAdamOptions {
  AdamConfig adam;
  size_t chunk_elems = 0;  // 0: pick by SearchChunkSize over `search`
  ChunkSearchRange search;
  PlacementPolicy policy = PlacementPolicy::kStatic;
  double offload_fraction = 0.5;     // kStatic
  uint64_t device_budget_bytes = 0;  // kAuto; 0 means the device's capacity
  int cpu_threads = 1;
  bool overlap = true;
};

// Seconds spent in each stage during the last Step. With overlap on the
// stages run concurrently and only total_s is wall time of the whole step.
struct StepTimings {
  double download_s = 0, cpu_adam_s = 0, upload_s = 0, device_adam_s = 0;
  double rebalance_s = 0, total_s = 0;
};

class ChunkedAdam {
 public:
  // Validates every option (InvalidArgument naming the field), lays out the
  // tensors, allocates all buffers, and places chunks by the policy.
  // Parameters start at zero.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChunkedAdam>> Create(
      Device* device, std::vector<TensorSpec> tensors,
      const ChunkedAdamOptions& options);
  ~ChunkedAdam();

  const ChunkLayout& layout() const { return layout_; }
  size_t resident_chunks() const { return resident_; }
  int64_t step() const { return step_; }
  const StepTimings& last_timings() const { return timings_; }

  // Host <-> optimizer transfers of one tensor, blocking. `values` must hold
  // exactly the tensor's element count.
  [[nodiscard]] absl::Status SetParams(size_t tensor,
                                       std::span<const float> values);
  absl::Status GetParams(size_t tensor, std::span<float> values) const;
  [[nodiscard]] absl::Status GetParamsBf16(size_t tensor,
                                           std::span<uint16_t> values) const;
  absl::Status SetGradients(size_t tensor, std::span<const float> values);
  // Device gradient / bf16 parameter buffers of a tensor, for the model.
  float* DeviceGradients(size_t tensor) const;
  uint16_t* DeviceParamsBf16(size_t tensor) const;

  // Where a tensor's fp32 master state lives now: device memory for a
  // resident chunk, host memory for an offloaded one. Valid until the next
  // Step, which may move chunks and rewrites the values: a reader (e.g. an
  // asynchronous checkpoint) must be done before Step is called. After
  // writing through these pointers, call ReloadMasterState.
  struct MasterState {
    float* p = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    bool on_device = false;
  };
  [[nodiscard]] absl::StatusOr<MasterState> MasterStateOf(size_t tensor) const;
  // After p, m and v were written in place (restored from a checkpoint):
  // rederives the bf16 working parameters from p and sets the step counter,
  // so the next Step is step + 1 with that step's bias correction.
  [[nodiscard]] absl::Status ReloadMasterState(int64_t step);

  // kAuto: the peak non-model device memory seen during this iteration; the
  // largest report since the last Step decides the next placement.
  void ReportNonModelPeak(uint64_t bytes);
  // kAuto: a new budget, applied at the next Step. Same validation as Create.
  [[nodiscard]] absl::Status SetDeviceBudget(uint64_t bytes);

  // One AdamW step over every tensor. Re-places chunks first when the policy
  // asks for a different number of resident chunks.
  [[nodiscard]] absl::Status Step();

 private:
  struct Chunk {
    float* host_p = nullptr;
    float* host_m = nullptr;
    float* host_v = nullptr;
    float* host_g = nullptr;
    uint16_t* host_bf16 = nullptr;
    float* dev_g = nullptr;
    uint16_t* dev_bf16 = nullptr;
    float* dev_p =
        nullptr;  // dev_p, dev_m, dev_v: one allocation, resident only
    float* dev_m = nullptr;
    float* dev_v = nullptr;
  };

  ChunkedAdam(Device* device, std::vector<TensorSpec> tensors,
              ChunkLayout layout, const ChunkedAdamOptions& options);
  [[nodiscard]] absl::Status AllocateChunks();
  absl::Status Promote(size_t chunk);               // host -> device
  [[nodiscard]] absl::Status Demote(size_t chunk);  // device -> host
  absl::Status PlaceResident(size_t target);
  [[nodiscard]] absl::Status CheckTensor(size_t tensor, size_t count,
                                         const char* what) const;
  absl::Status UpdateOverlapped(const AdamStepScalars& s);
  [[nodiscard]] absl::Status UpdateSerial(const AdamStepScalars& s);

  Device* const device_;
  const std::vector<TensorSpec> tensors_;
  const ChunkLayout layout_;
  const ChunkedAdamOptions options_;
  const DeviceFootprint footprint_;
  CpuAdam cpu_;
  std::vector<Chunk> chunks_;
  size_t resident_ = 0;
  uint64_t budget_ = 0;
  uint64_t non_model_peak_ = 0;
  bool peak_reported_ = false;  // since the last Step
  int64_t step_ = 0;
  StepTimings timings_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_CHUNKED_ADAM_H_
