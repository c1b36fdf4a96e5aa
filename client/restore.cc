// The restore and query paths of Client::Impl: Latest, one OpenRestore and
// then a copy out of the leased slot or a read of the shard file (see
// file_restore.h), each with checksum verification; WaitDurable.
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "client/file_restore.h"
#include "client/restore_progress.h"
#include "client/tensor_check.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt {

absl::StatusOr<int64_t> Client::Impl::LatestStep() {
  v1::LatestRequest req;
  req.set_job(options_.job);
  CKPT_ASSIGN_OR_RETURN(v1::LatestResponse resp, stub_->Latest(req));
  if (!resp.found())
    return absl::NotFoundError(
        absl::StrCat("Latest: job ", options_.job, " has no checkpoint"));
  if (resp.step() > static_cast<uint64_t>(INT64_MAX))
    return absl::DataLossError(
        absl::StrCat("Latest: step ", resp.step(), " out of range"));
  return static_cast<int64_t>(resp.step());
}

absl::Status Client::Impl::WaitDurable(int64_t step,
                                       std::chrono::milliseconds timeout) {
  if (step < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", step, " is negative"));
  if (timeout.count() < 0 || timeout.count() > UINT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout: ", timeout.count(), " ms is not in [0, 2^32) ms"));
  v1::WaitDurableRequest req;
  req.set_job(options_.job);
  req.set_rank(static_cast<uint32_t>(options_.rank));
  req.set_step(static_cast<uint64_t>(step));
  req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  return stub_->WaitDurable(req).status();
}

absl::Status Client::Impl::Restore(
    int64_t step, std::span<const Tensor> tensors,
    std::vector<std::optional<TensorLayout>>* layouts,
    std::optional<uint32_t> saved_rank) {
  if (step < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", step, " is negative"));
  std::vector<uint64_t> bytes;
  CKPT_RETURN_IF_ERROR(
      client::ValidateTensorsAndDevices(tensors, *devices_, &bytes));
  // What this call read, kept as the client's last restore's on return.
  RestoreStats stats;
  for (uint64_t b : bytes) stats.bytes += b;
  struct Keep {
    Impl* impl;
    const RestoreStats* stats;
    ~Keep() {
      std::lock_guard<std::mutex> l(impl->stats_mu_);
      impl->restore_stats_ = *stats;
    }
  } keep{this, &stats};

  // The fallback ladder: a copy that fails verification (DataLoss) is
  // reported bad, and the daemon serves the next one (memory, then the
  // file, then the object tier). With none left the error names every copy
  // tried.
  std::vector<std::string> tried;
  auto opened_any_saved_rank = [](const absl::Status& r) {
    return absl::StrContains(r.message(), client::kPartlyWritten);
  };
  for (int copy = 0; copy < 3; ++copy) {
    bool opened = false;
    std::vector<v1::TensorMeta> own_metas;
    absl::Status s =
        RestoreOneCopy(step, tensors, saved_rank, &opened, layouts, &own_metas);
    // A copy that served or failed verification was read whole.
    if (opened && (s.ok() || s.code() == absl::StatusCode::kDataLoss)) {
      stats.bytes_read += stats.bytes;
      stats.saved_ranks = 1;
    }
    // Not the place this rank saved (another layout, a whole tensor of
    // saved pieces, a rank the save did not have): a restore into another
    // layout, when the daemon can describe the step. Else the error as
    // it was.
    if (copy == 0 && !saved_rank && Reshardable(s, opened)) {
      stats.resharded = true;
      absl::Status r =
          RestoreResharded(step, tensors, own_metas, layouts, &stats);
      if (r.code() == absl::StatusCode::kNotFound &&
          absl::StartsWith(r.message(), "LayoutIndex") &&
          absl::StrContains(r.message(), "from peers' memory"))
        // No such step here, and the peers the coordinator named for it
        // failed: what this rank's own shard said, and which peers.
        return absl::NotFoundError(
            absl::StrCat(s.message(), " (", r.message(), ")"));
      if (r.code() == absl::StatusCode::kUnimplemented ||
          (r.code() == absl::StatusCode::kNotFound &&
           absl::StartsWith(r.message(), "LayoutIndex")))
        return s;  // an older daemon, or no such step
      // Refused before a byte moved: the refusal, and what this rank's
      // own shard said.
      if (!r.ok() && !opened_any_saved_rank(r))
        return absl::Status(r.code(),
                            absl::StrCat(r.message(), " (", s.message(), ")"));
      return r;
    }
    if (s.ok() || (copy == 0 && s.code() != absl::StatusCode::kDataLoss))
      return s;
    tried.emplace_back(s.message());
    // The daemon has no copy left to offer (or failed otherwise).
    if (!opened || s.code() != absl::StatusCode::kDataLoss) break;
  }
  return absl::DataLossError(absl::StrCat("restore of step ", step,
                                          ": no copy verifies; tried ",
                                          absl::StrJoin(tried, "; then ")));
}

absl::StatusOr<int64_t> Client::Impl::RestoreLatest(
    std::span<const Tensor> tensors) {
  // Each round restores the step Latest offers now; a step whose last copy
  // failed is no longer offered, so the steps tried strictly decrease and
  // the loop ends. A step that is offered again after it failed (the
  // daemon found the copy good) ends it with that step's error.
  std::vector<std::string> tried;
  int64_t last = -1;
  for (;;) {
    absl::StatusOr<int64_t> step = LatestStep();
    if (!step.ok()) {
      if (tried.empty() || step.status().code() != absl::StatusCode::kNotFound)
        return step.status();
      break;
    }
    if (last >= 0 && *step >= last) break;
    absl::Status s = Restore(*step, tensors, nullptr);
    if (s.ok()) return *step;
    if (s.code() != absl::StatusCode::kDataLoss) return s;
    tried.emplace_back(s.message());
    last = *step;
  }
  return absl::DataLossError(
      absl::StrCat("restore of the latest step: no step verifies; ",
                   absl::StrJoin(tried, "; ")));
}

bool Client::Impl::Reshardable(const absl::Status& s, bool opened) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:            // a name not in the shard,
    case absl::StatusCode::kFailedPrecondition:  // another place
      return true;
    case absl::StatusCode::kInvalidArgument:  // a rank the save did not have
      return !opened;
    default:
      return false;
  }
}

absl::Status Client::Impl::RestoreOneCopy(
    int64_t step, std::span<const Tensor> tensors,
    std::optional<uint32_t> saved_rank, bool* opened,
    std::vector<std::optional<TensorLayout>>* layouts,
    std::vector<v1::TensorMeta>* own_metas) {
  // The daemon decides the source: FILE (a lease on the file) only when
  // this process can read the shard file itself, else a slot it loaded the
  // shard into.
  v1::OpenRestoreRequest open;
  open.set_job(options_.job);
  open.set_rank(static_cast<uint32_t>(options_.rank));
  open.set_step(static_cast<uint64_t>(step));
  open.set_allow_file_read(true);
  if (saved_rank) open.set_saved_rank(*saved_rank);
  // The lease is the shard's rank's.
  const uint32_t lease_rank =
      saved_rank.value_or(static_cast<uint32_t>(options_.rank));
  // Host tensors are copied while the daemon still loads the rest.
  EarlyCopy early;
  CKPT_ASSIGN_OR_RETURN(v1::OpenRestoreResponse resp,
                        OpenRestoreCopying(open, tensors, &early));
  *opened = true;
  // After a restore that verified, the layouts the tensors were saved with
  // (MatchIndex matched every name).
  auto report = [&](absl::Status s) {
    if (own_metas != nullptr && Reshardable(s, true))
      own_metas->assign(resp.tensors().begin(), resp.tensors().end());
    if (s.ok() && layouts != nullptr) {
      std::vector<const v1::TensorMeta*> metas;
      s = client::MatchIndex(resp, tensors, &metas);
      layouts->clear();
      for (const v1::TensorMeta* m : metas)
        layouts->push_back(s.ok() ? client::SavedLayout(*m) : std::nullopt);
    }
    return Annotate(s, absl::StrCat("restore of step ", step));
  };
  if (resp.source() == v1::RESTORE_SOURCE_FILE) {
    std::vector<const v1::TensorMeta*> metas;
    absl::Status s = client::MatchIndex(resp, tensors, &metas);
    if (s.ok())
      s = file_restorer_->Restore(resp.path(), resp.image_bytes(), tensors,
                                  metas);
    // The lease holds the file against deletes until now (a daemon
    // before leases on files answers 0: then only a bad copy is told).
    if (resp.lease() != 0 || s.code() == absl::StatusCode::kDataLoss) {
      s = CloseLease(lease_rank, static_cast<uint64_t>(step), resp.lease(),
                     std::move(s));
    }
    return report(s);
  }
  return report(RestoreFromSlot(resp, tensors, lease_rank, &early));
}

absl::StatusOr<v1::OpenRestoreResponse> Client::Impl::OpenRestoreCopying(
    const v1::OpenRestoreRequest& open, std::span<const Tensor> tensors,
    EarlyCopy* early) {
  if (!stream_restores_.load(std::memory_order_relaxed))
    return stub_->OpenRestore(open);
  std::unique_ptr<client::DaemonStub::RestoreStream> stream =
      stub_->OpenRestoreStream(open);
  client::RestoreProgressCheck check;
  v1::RestoreProgress msg;
  std::vector<uint32_t> fresh;
  absl::Status bad;  // the first message refused; the rest is drained
  uint64_t lease = 0;
  bool any = false;
  while (stream->Read(&msg)) {
    any = true;
    if (msg.has_done()) lease = msg.done().lease();
    if (!bad.ok()) continue;
    bad = check.Next(msg, &fresh);
    if (!bad.ok()) continue;
    if (msg.has_opened()) StartEarlyCopy(check.opened(), tensors, early);
    if (!fresh.empty()) CopyVerified(fresh, tensors, early);
  }
  absl::Status s = stream->Finish();
  if (s.code() == absl::StatusCode::kUnimplemented && !any) {
    stream_restores_.store(false, std::memory_order_relaxed);  // older ckptd
    return stub_->OpenRestore(open);
  }
  if (s.ok() && bad.ok() && !check.has_done())
    bad = absl::InternalError("OpenRestoreStream: ended without its answer");
  if (!bad.ok() && s.ok() && lease != 0) {
    // The daemon leased the slot on an answer refused here.
    v1::CloseRestoreRequest close;
    close.set_job(options_.job);
    close.set_rank(open.has_saved_rank() ? open.saved_rank() : open.rank());
    close.set_lease(lease);
    (void)stub_->CloseRestore(close);
  }
  CKPT_RETURN_IF_ERROR(s);
  CKPT_RETURN_IF_ERROR(bad);
  return check.done();
}

void Client::Impl::StartEarlyCopy(const v1::OpenRestoreResponse& opened,
                                  std::span<const Tensor> tensors,
                                  EarlyCopy* e) {
  // Whatever fails here is found again on the final answer (the same slot
  // and index), where it is the restore's error: nothing is copied early.
  e->opened = opened;
  absl::StatusOr<SlotImage> slot = MapSlotImage(e->opened);
  if (!slot.ok()) return;
  if (!client::MatchIndex(e->opened, tensors, &e->metas).ok()) return;
  e->slot = std::move(*slot);
  std::unordered_map<const v1::TensorMeta*, size_t> index;
  for (int j = 0; j < e->opened.tensors_size(); ++j)
    index[&e->opened.tensors(j)] = static_cast<size_t>(j);
  e->callers.assign(static_cast<size_t>(e->opened.tensors_size()), {});
  for (size_t i = 0; i < tensors.size(); ++i)
    e->callers[index.at(e->metas[i])].push_back(i);
  e->copied.assign(tensors.size(), 0);
  e->sums.assign(tensors.size(), 0);
  e->active = true;
}

void Client::Impl::CopyVerified(std::span<const uint32_t> fresh,
                                std::span<const Tensor> tensors, EarlyCopy* e) {
  if (!e->active || !e->status.ok()) return;
  std::vector<client::CopyRegion> regions;
  std::vector<size_t> which;
  for (uint32_t t : fresh) {
    for (size_t i : e->callers[t]) {
      // Device tensors wait for the answer (one DMA batch, CopyOutOfSlot).
      if (!tensors[i].device.is_host()) continue;
      regions.push_back({e->slot.image + e->metas[i]->offset(), tensors[i].data,
                         e->metas[i]->bytes()});
      which.push_back(i);
    }
  }
  if (regions.empty()) return;
  std::vector<uint64_t> sums(regions.size());
  engine_.Run(regions, sums);
  for (size_t k = 0; k < which.size(); ++k) {
    const size_t i = which[k];
    e->copied[i] = 1;
    e->sums[i] = sums[k];
    // The slot is writable by this job's uid: the bytes are hashed again
    // as they are copied, and checked against the index from the socket.
    const v1::TensorMeta& m = *e->metas[i];
    if (m.has_checksum() && m.checksum() != sums[k] && e->status.ok())
      e->status = absl::DataLossError(absl::StrFormat(
          "%s: checksum mismatch (stored %016x, computed %016x)",
          client::TensorLabel(tensors, i), m.checksum(), sums[k]));
  }
}

absl::StatusOr<Client::Impl::SlotImage> Client::Impl::MapSlotImage(
    const v1::OpenRestoreResponse& resp) {
  SlotImage slot;
  {
    std::lock_guard<std::mutex> l(arena_mu_);
    CKPT_ASSIGN_OR_RETURN(slot.arena,
                          ArenaLocked(resp.shm_name(), resp.arena_bytes(),
                                      shm::Arena::SlotsOffset()));
    if (slot.arena != save_arena_) restore_arena_ = slot.arena;
  }
  const shm::Arena& a = *slot.arena->arena;
  if (resp.slot_offset() < a.slot_offset(0) || resp.slot_offset() > a.size() ||
      a.size() - resp.slot_offset() < resp.image_bytes())
    return absl::InternalError(absl::StrCat(
        "OpenRestore: image of ", resp.image_bytes(), " bytes at offset ",
        resp.slot_offset(), " lies outside arena ", a.name(), " of ", a.size(),
        " bytes"));
  slot.image = a.base() + resp.slot_offset();
  return slot;
}

absl::Status Client::Impl::RestoreFromSlot(const v1::OpenRestoreResponse& resp,
                                           std::span<const Tensor> tensors,
                                           uint32_t lease_rank,
                                           const EarlyCopy* early) {
  absl::Status s = [&]() -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(SlotImage slot, MapSlotImage(resp));
    return CopyOutOfSlot(resp, slot.image, tensors, early);
  }();
  return CloseLease(lease_rank, /*step=*/0, resp.lease(), std::move(s));
}

absl::Status Client::Impl::CloseLease(uint32_t rank, uint64_t step,
                                      uint64_t lease, absl::Status s) {
  v1::CloseRestoreRequest close;
  close.set_job(options_.job);
  close.set_rank(rank);
  close.set_step(step);
  close.set_lease(lease);
  if (s.code() == absl::StatusCode::kDataLoss)
    close.set_bad_copy(std::string(s.message().substr(0, 1024)));
  absl::Status closed = stub_->CloseRestore(close).status();
  if (s.ok() && lease != 0) return closed;
  return s;
}

absl::Status Client::Impl::CopyOutOfSlot(const v1::OpenRestoreResponse& resp,
                                         const char* image,
                                         std::span<const Tensor> tensors,
                                         const EarlyCopy* early) {
  std::vector<const v1::TensorMeta*> metas;
  CKPT_RETURN_IF_ERROR(client::MatchIndex(resp, tensors, &metas));
  if (early != nullptr && !early->active) early = nullptr;
  if (early != nullptr) CKPT_RETURN_IF_ERROR(early->status);
  auto copied = [&](size_t i) { return early != nullptr && early->copied[i]; };

  // One engine run: host tensors are copied and hashed, device tensors'
  // slot bytes only hashed while their DMA runs. Those copied while the
  // daemon loaded are done.
  std::vector<client::CopyRegion> regions;
  std::vector<size_t> which;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (copied(i)) continue;
    const bool host = tensors[i].device.is_host();
    regions.push_back({image + metas[i]->offset(),
                       host ? tensors[i].data : nullptr, metas[i]->bytes()});
    which.push_back(i);
  }
  absl::Status s;
  std::unique_ptr<client::DeviceCopyBatch> dma;
  for (size_t k = 0; k < which.size() && s.ok(); ++k) {
    const size_t i = which[k];
    if (tensors[i].device.is_host()) continue;
    if (!dma) dma = devices_->NewBatch();
    s = dma->EnqueueToDevice(tensors[i].device.index, tensors[i].data,
                             regions[k].src, regions[k].bytes);
    if (!s.ok()) s = Annotate(s, client::TensorLabel(tensors, i));
  }
  std::vector<uint64_t> part(regions.size());
  if (s.ok()) engine_.Run(regions, part);
  std::vector<uint64_t> sums(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (copied(i)) sums[i] = early->sums[i];
  for (size_t k = 0; k < which.size(); ++k) sums[which[k]] = part[k];
  if (dma) {
    // Wait even after an enqueue error: the slot's lease is closed next.
    absl::Status w = dma->Wait();
    if (s.ok() && !w.ok()) s = Annotate(w, "restore: device copies");
  }
  CKPT_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (metas[i]->has_checksum() && metas[i]->checksum() != sums[i])
      return absl::DataLossError(absl::StrFormat(
          "%s: checksum mismatch (stored %016x, computed %016x)",
          client::TensorLabel(tensors, i), metas[i]->checksum(), sums[i]));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
