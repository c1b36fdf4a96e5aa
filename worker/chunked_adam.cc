#include "worker/chunked_adam.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::worker {

namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkedAdam>> ChunkedAdam::Create(
    Device* device, std::vector<TensorSpec> tensors,
    const ChunkedAdamOptions& options) {
  if (device == nullptr)
    return absl::InvalidArgumentError("optimizer: device is null");
  CKPT_RETURN_IF_ERROR(ValidateAdamConfig(options.adam));
  if (options.cpu_threads < 1 || options.cpu_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu_threads = ", options.cpu_threads, ": must be in [1, 1024]"));
  }
  absl::StatusOr<ChunkLayout> layout =
      options.chunk_elems != 0 ? NextFitLayout(tensors, options.chunk_elems)
                               : SearchChunkSize(tensors, options.search);
  if (!layout.ok()) return layout.status();
  DeviceFootprint f = FootprintOf(layout->num_chunks(), layout->chunk_elems);
  uint64_t budget = 0;
  size_t resident = 0;
  if (options.policy == PlacementPolicy::kStatic) {
    CKPT_RETURN_IF_ERROR(ValidateOffloadFraction(options.offload_fraction));
    resident =
        StaticResidentChunks(options.offload_fraction, layout->num_chunks());
    uint64_t need = f.fixed_bytes + resident * f.resident_chunk_bytes;
    if (need > device->capacity_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offload_fraction = ", options.offload_fraction, ": keeps ", resident,
          " of ", layout->num_chunks(), " chunks on ", device->name(),
          ", needing ", need, " bytes, above its capacity of ",
          device->capacity_bytes()));
    }
  } else {
    budget = options.device_budget_bytes != 0 ? options.device_budget_bytes
                                              : device->capacity_bytes();
    if (budget > device->capacity_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_budget_bytes = ", budget, ": above ", device->name(),
          "'s capacity of ", device->capacity_bytes()));
    }
    CKPT_RETURN_IF_ERROR(ValidateAutoBudget(budget, f));
    resident = AutoResidentChunks(budget, 0, f, layout->num_chunks());
  }
  std::unique_ptr<ChunkedAdam> opt(
      new ChunkedAdam(device, std::move(tensors), *std::move(layout), options));
  opt->budget_ = budget;
  CKPT_RETURN_IF_ERROR(opt->AllocateChunks());
  CKPT_RETURN_IF_ERROR(opt->PlaceResident(resident));
  return opt;
}

ChunkedAdam::ChunkedAdam(Device* device, std::vector<TensorSpec> tensors,
                         ChunkLayout layout, const ChunkedAdamOptions& options)
    : device_(device),
      tensors_(std::move(tensors)),
      layout_(std::move(layout)),
      options_(options),
      footprint_(FootprintOf(layout_.num_chunks(), layout_.chunk_elems)),
      cpu_(options.cpu_threads),
      chunks_(layout_.num_chunks()) {}

ChunkedAdam::~ChunkedAdam() {
  for (Queue q : {Queue::kCompute, Queue::kDownload, Queue::kUpload}) {
    device_->Synchronize(q).IgnoreError();  // nothing left to report to
  }
  for (Chunk& c : chunks_) {
    device_->Free(c.dev_p);
    device_->Free(c.dev_g);
    device_->FreeHost(c.host_p);
    device_->FreeHost(c.host_bf16);
  }
}

absl::Status ChunkedAdam::AllocateChunks() {
  const size_t n = layout_.chunk_elems;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = chunks_[i];
    std::string what = absl::StrCat("chunk ", i);
    CKPT_ASSIGN_OR_RETURN(void* host,
                          device_->AllocateHost(16 * n, what + " host state"));
    std::memset(host, 0, 16 * n);
    c.host_p = static_cast<float*>(host);
    c.host_m = c.host_p + n;
    c.host_v = c.host_m + n;
    c.host_g = c.host_v + n;
    CKPT_ASSIGN_OR_RETURN(void* bf16,
                          device_->AllocateHost(2 * n, what + " host bf16"));
    std::memset(bf16, 0, 2 * n);
    c.host_bf16 = static_cast<uint16_t*>(bf16);
    CKPT_ASSIGN_OR_RETURN(
        void* dev, device_->Allocate(kFixedBytesPerElem * n,
                                     what + " gradients and bf16 params"));
    c.dev_g = static_cast<float*>(dev);
    c.dev_bf16 = reinterpret_cast<uint16_t*>(c.dev_g + n);
    CKPT_RETURN_IF_ERROR(
        device_->CopyToDeviceAsync(Queue::kUpload, c.dev_g, c.host_g, 4 * n));
    CKPT_RETURN_IF_ERROR(device_->CopyToDeviceAsync(Queue::kUpload, c.dev_bf16,
                                                    c.host_bf16, 2 * n));
  }
  return device_->Synchronize(Queue::kUpload);
}

absl::Status ChunkedAdam::Promote(size_t i) {
  Chunk& c = chunks_[i];
  const size_t n = layout_.chunk_elems;
  CKPT_ASSIGN_OR_RETURN(void* dev,
                        device_->Allocate(kResidentBytesPerElem * n,
                                          absl::StrCat("chunk ", i, " state")));
  c.dev_p = static_cast<float*>(dev);
  c.dev_m = c.dev_p + n;
  c.dev_v = c.dev_m + n;
  // host_p, host_m, host_v are contiguous, and so are their device twins.
  absl::Status s =
      device_->CopyToDeviceAsync(Queue::kUpload, c.dev_p, c.host_p, 12 * n);
  if (s.ok()) s = device_->Synchronize(Queue::kUpload);
  if (!s.ok()) {  // stay offloaded: the host copy is still the master
    device_->Free(c.dev_p);
    c.dev_p = c.dev_m = c.dev_v = nullptr;
  }
  return s;
}

absl::Status ChunkedAdam::Demote(size_t i) {
  Chunk& c = chunks_[i];
  const size_t n = layout_.chunk_elems;
  CKPT_RETURN_IF_ERROR(
      device_->CopyToHostAsync(Queue::kDownload, c.host_p, c.dev_p, 12 * n));
  CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kDownload));
  device_->Free(c.dev_p);
  c.dev_p = c.dev_m = c.dev_v = nullptr;
  return absl::OkStatus();
}

absl::Status ChunkedAdam::PlaceResident(size_t target) {
  target = std::min(target, chunks_.size());
  while (resident_ > target) {
    CKPT_RETURN_IF_ERROR(Demote(resident_ - 1));
    --resident_;
  }
  while (resident_ < target) {
    CKPT_RETURN_IF_ERROR(Promote(resident_));
    ++resident_;
  }
  return absl::OkStatus();
}

absl::Status ChunkedAdam::CheckTensor(size_t tensor, size_t count,
                                      const char* what) const {
  if (tensor >= tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tensor index ",
                                                   tensor, " out of range (",
                                                   tensors_.size(), ")"));
  }
  if (count != tensors_[tensor].numel) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tensor '", tensors_[tensor].name, "' has ",
                     tensors_[tensor].numel, " elements, got ", count));
  }
  return absl::OkStatus();
}

absl::Status ChunkedAdam::SetParams(size_t tensor,
                                    std::span<const float> values) {
  CKPT_RETURN_IF_ERROR(CheckTensor(tensor, values.size(), "SetParams"));
  const TensorSlot& slot = layout_.slots[tensor];
  Chunk& c = chunks_[slot.chunk];
  std::memcpy(c.host_p + slot.offset, values.data(), values.size_bytes());
  for (size_t i = 0; i < values.size(); ++i)
    c.host_bf16[slot.offset + i] = FloatToBf16(values[i]);
  if (c.dev_p != nullptr) {
    CKPT_RETURN_IF_ERROR(device_->CopyToDeviceAsync(
        Queue::kUpload, c.dev_p + slot.offset, c.host_p + slot.offset,
        values.size_bytes()));
  }
  CKPT_RETURN_IF_ERROR(
      device_->CopyToDeviceAsync(Queue::kUpload, c.dev_bf16 + slot.offset,
                                 c.host_bf16 + slot.offset, 2 * values.size()));
  return device_->Synchronize(Queue::kUpload);
}

absl::Status ChunkedAdam::GetParams(size_t tensor,
                                    std::span<float> values) const {
  CKPT_RETURN_IF_ERROR(CheckTensor(tensor, values.size(), "GetParams"));
  const TensorSlot& slot = layout_.slots[tensor];
  const Chunk& c = chunks_[slot.chunk];
  if (c.dev_p == nullptr) {
    std::memcpy(values.data(), c.host_p + slot.offset, values.size_bytes());
    return absl::OkStatus();
  }
  CKPT_RETURN_IF_ERROR(device_->CopyToHostAsync(Queue::kDownload, values.data(),
                                                c.dev_p + slot.offset,
                                                values.size_bytes()));
  return device_->Synchronize(Queue::kDownload);
}

absl::Status ChunkedAdam::GetParamsBf16(size_t tensor,
                                        std::span<uint16_t> values) const {
  CKPT_RETURN_IF_ERROR(CheckTensor(tensor, values.size(), "GetParamsBf16"));
  const TensorSlot& slot = layout_.slots[tensor];
  CKPT_RETURN_IF_ERROR(device_->CopyToHostAsync(
      Queue::kDownload, values.data(),
      chunks_[slot.chunk].dev_bf16 + slot.offset, values.size_bytes()));
  return device_->Synchronize(Queue::kDownload);
}

absl::Status ChunkedAdam::SetGradients(size_t tensor,
                                       std::span<const float> values) {
  CKPT_RETURN_IF_ERROR(CheckTensor(tensor, values.size(), "SetGradients"));
  CKPT_RETURN_IF_ERROR(
      device_->CopyToDeviceAsync(Queue::kUpload, DeviceGradients(tensor),
                                 values.data(), values.size_bytes()));
  return device_->Synchronize(Queue::kUpload);
}

float* ChunkedAdam::DeviceGradients(size_t tensor) const {
  const TensorSlot& slot = layout_.slots.at(tensor);
  return chunks_[slot.chunk].dev_g + slot.offset;
}

uint16_t* ChunkedAdam::DeviceParamsBf16(size_t tensor) const {
  const TensorSlot& slot = layout_.slots.at(tensor);
  return chunks_[slot.chunk].dev_bf16 + slot.offset;
}

void ChunkedAdam::ReportNonModelPeak(uint64_t bytes) {
  if (!peak_reported_ || bytes > non_model_peak_) non_model_peak_ = bytes;
  peak_reported_ = true;
}

absl::Status ChunkedAdam::SetDeviceBudget(uint64_t bytes) {
  if (options_.policy != PlacementPolicy::kAuto) {
    return absl::FailedPreconditionError(
        "device_budget_bytes: only the auto policy has a budget");
  }
  if (bytes > device_->capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_budget_bytes = ", bytes, ": above ", device_->name(),
        "'s capacity of ", device_->capacity_bytes()));
  }
  CKPT_RETURN_IF_ERROR(ValidateAutoBudget(bytes, footprint_));
  budget_ = bytes;
  return absl::OkStatus();
}

absl::Status ChunkedAdam::Step() {
  timings_ = StepTimings{};
  double start = Now();
  if (options_.policy == PlacementPolicy::kAuto) {
    // A peak from this iteration replaces the last one; without a report the
    // last one still stands.
    peak_reported_ = false;
    CKPT_RETURN_IF_ERROR(PlaceResident(AutoResidentChunks(
        budget_, non_model_peak_, footprint_, chunks_.size())));
  }
  timings_.rebalance_s = Now() - start;
  ++step_;
  AdamStepScalars s = MakeStepScalars(options_.adam, step_);
  absl::Status status =
      options_.overlap ? UpdateOverlapped(s) : UpdateSerial(s);
  timings_.total_s = Now() - start;
  return status;
}

}  // namespace ckpt::worker
