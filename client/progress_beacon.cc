#include "client/progress_beacon.h"

#include <cstdio>

namespace ckpt::client {

void ProgressBeacon::ProgressSlow(int64_t step, uint64_t compute_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  shm::BeaconWriter* w = writer_.load(std::memory_order_relaxed);
  if (w != nullptr) {
    w->Progress(step, compute_ns);
    return;
  }
  pending_progress_ = {step, compute_ns};
}

void ProgressBeacon::ExpectPause(uint64_t pause_ms, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  shm::BeaconWriter* w = writer_.load(std::memory_order_relaxed);
  if (w != nullptr) {
    w->ExpectPause(pause_ms, reason);
    return;
  }
  pending_pause_ = {pause_ms, reason};
}

void ProgressBeacon::Attach(const std::string& name, dev_t dev, ino_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!writers_.empty() && dev == dev_ && ino == ino_) return;
  auto w = shm::BeaconWriter::Open(name);
  if (!w.ok()) {
    std::fprintf(stderr, "libckpt: no progress beacon in arena %s: %s\n",
                 name.c_str(), std::string(w.status().message()).c_str());
    return;
  }
  // What the old mapping or the caller last said goes on in the new one.
  if (pending_progress_) {
    (*w)->Progress(pending_progress_->first, pending_progress_->second);
    pending_progress_.reset();
  }
  if (pending_pause_) {
    (*w)->ExpectPause(pending_pause_->first, pending_pause_->second);
    pending_pause_.reset();
  }
  dev_ = dev;
  ino_ = ino;
  writers_.push_back(std::move(*w));
  writer_.store(writers_.back().get(), std::memory_order_release);
}

}  // namespace ckpt::client
