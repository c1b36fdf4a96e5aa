// The update of one step: the overlapped pipeline and its serial baseline.
#include <chrono>

#include "util/status.h"
#include "worker/chunked_adam.h"

namespace ckpt::worker {

namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status ChunkedAdam::UpdateOverlapped(const AdamStepScalars& s) {
  // Resident chunks: the device's own Adam, concurrent with all below.
  for (size_t i = 0; i < resident_; ++i) {
    const Chunk& c = chunks_[i];
    AdamSpan span{c.dev_p, c.dev_g,    c.dev_m,
                  c.dev_v, c.dev_bf16, layout_.chunk_used[i]};
    CKPT_RETURN_IF_ERROR(device_->AdamAsync(Queue::kCompute, s, span));
  }
  // Stage 1: every gradient download is queued at once; the download queue
  // runs them in chunk order while the stages behind it work.
  std::vector<std::unique_ptr<DeviceEvent>> downloaded;
  absl::Status status;
  for (size_t i = resident_; i < chunks_.size() && status.ok(); ++i) {
    const Chunk& c = chunks_[i];
    status = device_->CopyToHostAsync(Queue::kDownload, c.host_g, c.dev_g,
                                      4 * layout_.chunk_used[i]);
    if (status.ok()) {
      absl::StatusOr<std::unique_ptr<DeviceEvent>> e =
          device_->Record(Queue::kDownload);
      if (e.ok()) downloaded.push_back(*std::move(e));
      status = e.status();
    }
  }
  // Stage 2 on this thread (and the CpuAdam pool), stage 3 queued behind it.
  for (size_t k = 0; k < downloaded.size() && status.ok(); ++k) {
    const size_t i = resident_ + k;
    const Chunk& c = chunks_[i];
    status = downloaded[k]->Wait();
    if (!status.ok()) break;
    double t0 = Now();
    cpu_.Update(s, {c.host_p, c.host_g, c.host_m, c.host_v, c.host_bf16,
                    layout_.chunk_used[i]});
    timings_.cpu_adam_s += Now() - t0;
    status = device_->CopyToDeviceAsync(Queue::kUpload, c.dev_bf16, c.host_bf16,
                                        2 * layout_.chunk_used[i]);
  }
  // Drain every queue even after an error: queued work points at our buffers.
  for (Queue q : {Queue::kDownload, Queue::kUpload, Queue::kCompute}) {
    absl::Status synced = device_->Synchronize(q);
    if (status.ok()) status = synced;
  }
  return status;
}

absl::Status ChunkedAdam::UpdateSerial(const AdamStepScalars& s) {
  double t0 = Now();
  for (size_t i = 0; i < resident_; ++i) {
    const Chunk& c = chunks_[i];
    AdamSpan span{c.dev_p, c.dev_g,    c.dev_m,
                  c.dev_v, c.dev_bf16, layout_.chunk_used[i]};
    CKPT_RETURN_IF_ERROR(device_->AdamAsync(Queue::kCompute, s, span));
  }
  CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kCompute));
  timings_.device_adam_s = Now() - t0;
  for (size_t i = resident_; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const size_t n = layout_.chunk_used[i];
    t0 = Now();
    CKPT_RETURN_IF_ERROR(
        device_->CopyToHostAsync(Queue::kDownload, c.host_g, c.dev_g, 4 * n));
    CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kDownload));
    double t1 = Now();
    cpu_.Update(s, {c.host_p, c.host_g, c.host_m, c.host_v, c.host_bf16, n});
    double t2 = Now();
    CKPT_RETURN_IF_ERROR(device_->CopyToDeviceAsync(Queue::kUpload, c.dev_bf16,
                                                    c.host_bf16, 2 * n));
    CKPT_RETURN_IF_ERROR(device_->Synchronize(Queue::kUpload));
    timings_.download_s += t1 - t0;
    timings_.cpu_adam_s += t2 - t1;
    timings_.upload_s += Now() - t2;
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
