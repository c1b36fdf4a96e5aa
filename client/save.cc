// The save path of Client::Impl: validation on the caller's thread, then
// BeginSave, copy and CommitSave on the saver thread.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/tensor_check.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt {

namespace {

double Seconds(Client::Impl::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

absl::StatusOr<SaveHandle> Client::Impl::SaveAsync(
    int64_t step, std::span<const Tensor> tensors, const SaveOptions& options) {
  if (step < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", step, " is negative"));
  SaveJob job;
  job.start = Clock::now();
  job.step = step;
  job.options = options;
  CKPT_RETURN_IF_ERROR(
      client::ValidateTensorsAndDevices(tensors, *devices_, &job.bytes));
  // A tensor placed in a global tensor makes the shard a version-2 one,
  // whose index is longer (the daemon decides the same way).
  bool with_layout = false;
  for (const Tensor& t : tensors)
    with_layout |= t.layout.has_value() && !t.layout->global_shape.empty();
  auto layout = storage::ComputeLayout(job.bytes, with_layout);
  if (!layout.ok()) return Annotate(layout.status(), "save: shard layout");
  job.layout = std::move(*layout);
  job.tensors.assign(tensors.begin(), tensors.end());
  job.state = std::make_shared<SaveHandle::State>();
  SaveHandle handle(job.state);

  std::unique_lock<std::mutex> l(queue_mu_);
  gate_cv_.wait(l, [&] { return !copy_gate_closed_ || stop_; });
  if (stop_) return absl::CancelledError("save: the client is closing");
  copy_gate_closed_ = true;
  queue_.push_back(std::move(job));
  l.unlock();
  queue_cv_.notify_one();
  return handle;
}

void Client::Impl::SaverLoop() {
  for (;;) {
    std::unique_lock<std::mutex> l(queue_mu_);
    queue_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and every save is done
    SaveJob job = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    RunSave(job);
  }
}

void Client::Impl::ReleaseCopyGate() {
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    copy_gate_closed_ = false;
  }
  gate_cv_.notify_all();
}

void Client::Impl::RunSave(SaveJob& job) {
  SaveStats stats;
  for (uint64_t b : job.bytes) stats.bytes += b;
  const uint64_t image_bytes = job.layout.image_bytes;
  auto fail = [&](absl::Status s) {
    ReleaseCopyGate();
    job.state->SetDone(std::move(s));
  };

  Clock::time_point t0 = Clock::now();
  auto arena = SaveArena(image_bytes);
  if (!arena.ok()) return fail(arena.status());
  const shm::Arena& a = *(*arena)->arena;

  v1::BeginSaveRequest begin;
  begin.set_job(options_.job);
  begin.set_rank(static_cast<uint32_t>(options_.rank));
  begin.set_step(static_cast<uint64_t>(job.step));
  begin.set_block(options_.block_when_busy);
  begin.set_rewind(job.options.rewind);
  begin.set_timeout_ms(static_cast<uint32_t>(options_.busy_timeout.count()));
  begin.set_image_bytes(image_bytes);
  auto slot = stub_->BeginSave(begin);
  if (!slot.ok()) return fail(slot.status());
  stats.wait_slot_s = slot->waited_s();
  Clock::time_point t1 = Clock::now();
  stats.rpc_s = std::max(0.0, Seconds(t1 - t0) - stats.wait_slot_s);

  v1::AbortSaveRequest abort;
  abort.set_job(options_.job);
  abort.set_rank(static_cast<uint32_t>(options_.rank));
  abort.set_lease(slot->lease());
  // The daemon's answer is input too: the slot must lie inside our mapping.
  if (slot->slot() >= a.num_slots() || slot->slot_offset() < a.slot_offset(0) ||
      slot->slot_offset() > a.size() ||
      a.size() - slot->slot_offset() < image_bytes) {
    // The slot error is the one to report; an abort that fails leaves the
    // lease to the daemon's reaper.
    (void)stub_->AbortSave(abort);
    return fail(absl::InternalError(absl::StrCat(
        "BeginSave: slot ", slot->slot(), " at offset ", slot->slot_offset(),
        " cannot hold ", image_bytes, " bytes in arena ", a.name(), " of ",
        a.size(), " bytes")));
  }

  std::vector<uint64_t> checksums(job.tensors.size());
  // Each host tensor's chunk hashes, from chunk_first[i] on.
  std::vector<uint64_t> chunk_hashes;
  std::vector<size_t> chunk_first(job.tensors.size(), 0);
  absl::Status copied = CopyIntoSlot(job, a.base() + slot->slot_offset(),
                                     &checksums, &chunk_hashes, &chunk_first);
  Clock::time_point t2 = Clock::now();
  stats.copy_s = Seconds(t2 - t1);
  if (!copied.ok()) {
    // The copy error is the one to report; a failed abort is reaped.
    (void)stub_->AbortSave(abort);
    return fail(copied);
  }
  ReleaseCopyGate();
  job.state->SetCopied(absl::OkStatus());

  v1::CommitSaveRequest commit;
  commit.set_job(options_.job);
  commit.set_rank(static_cast<uint32_t>(options_.rank));
  commit.set_step(static_cast<uint64_t>(job.step));
  commit.set_slot(slot->slot());
  commit.set_lease(slot->lease());
  if (options_.generation) commit.set_generation(*options_.generation);
  commit.mutable_tensors()->Reserve(static_cast<int>(job.tensors.size()));
  for (size_t i = 0; i < job.tensors.size(); ++i) {
    const Tensor& t = job.tensors[i];
    v1::TensorMeta* m = commit.add_tensors();
    m->set_name(t.name);
    m->set_dtype(static_cast<uint32_t>(t.dtype));
    for (int64_t d : t.shape) m->add_shape(static_cast<uint64_t>(d));
    m->set_offset(job.layout.tensor_offsets[i]);
    m->set_bytes(job.bytes[i]);
    m->set_has_checksum(t.device.is_host());
    m->set_checksum(t.device.is_host() ? checksums[i] : 0);
    // A reader of part of the tensor verifies only what it reads.
    const uint64_t chunks = ChecksumChunks(job.bytes[i]);
    if (t.device.is_host() && chunks >= 2)
      m->mutable_chunk_hashes()->Add(
          chunk_hashes.begin() + static_cast<ptrdiff_t>(chunk_first[i]),
          chunk_hashes.begin() +
              static_cast<ptrdiff_t>(chunk_first[i] + chunks));
    if (t.layout) {
      for (int64_t d : t.layout->global_shape)
        m->add_global_shape(static_cast<uint64_t>(d));
      for (int64_t d : t.layout->offsets)
        m->add_piece_offsets(static_cast<uint64_t>(d));
      m->set_global_name(t.layout->global_name);
    }
  }
  auto committed = stub_->CommitSave(commit);
  Clock::time_point t3 = Clock::now();
  stats.rpc_s += Seconds(t3 - t2);
  stats.total_s = Seconds(t3 - job.start);
  if (!committed.ok()) {
    // The lease may still hold the slot; free it so later saves find one.
    // The commit error is the one to report; a failed abort is reaped.
    (void)stub_->AbortSave(abort);
    job.state->SetDone(committed.status());
    return;
  }
  {
    std::lock_guard<std::mutex> l(stats_mu_);
    stats_ = stats;
  }
  job.state->SetDone(absl::OkStatus());
}

absl::Status Client::Impl::CopyIntoSlot(SaveJob& job, char* slot,
                                        std::vector<uint64_t>* checksums,
                                        std::vector<uint64_t>* chunk_hashes,
                                        std::vector<size_t>* chunk_first) {
  std::vector<client::CopyRegion> regions;
  std::vector<size_t> host_index;
  regions.reserve(job.tensors.size());
  host_index.reserve(job.tensors.size());
  absl::Status s;
  bool any_device = false;
  for (size_t i = 0; i < job.tensors.size() && s.ok(); ++i) {
    const Tensor& t = job.tensors[i];
    if (t.device.is_host()) continue;
    // One batch for the saver thread's lifetime: its streams are reused.
    if (!save_dma_) save_dma_ = devices_->NewBatch();
    any_device = true;
    s = save_dma_->EnqueueToHost(t.device.index,
                                 slot + job.layout.tensor_offsets[i], t.data,
                                 job.bytes[i]);
    if (!s.ok()) s = Annotate(s, client::TensorLabel(job.tensors, i));
  }
  for (size_t i = 0; i < job.tensors.size(); ++i) {
    if (!job.tensors[i].device.is_host()) continue;
    regions.push_back({job.tensors[i].data, slot + job.layout.tensor_offsets[i],
                       job.bytes[i]});
    host_index.push_back(i);
  }
  // Host copies overlap the DMA of the device tensors.
  std::vector<uint64_t> host_sums(regions.size());
  if (s.ok()) engine_.Run(regions, host_sums, chunk_hashes);
  size_t first = 0;
  for (size_t k = 0; k < host_index.size(); ++k) {
    (*checksums)[host_index[k]] = host_sums[k];
    (*chunk_first)[host_index[k]] = first;
    first += ChecksumChunks(regions[k].bytes);
  }
  // Wait even after an enqueue error: no DMA may land in an aborted slot.
  if (any_device) {
    absl::Status w = save_dma_->Wait();
    if (s.ok() && !w.ok()) s = Annotate(w, "save: device copies");
  }
  return s;
}

}  // namespace ckpt
