// Client, SaveHandle and the arena bookkeeping of Client::Impl.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "util/status.h"

namespace ckpt {

// ---- SaveHandle ----

void SaveHandle::State::SetCopied(absl::Status s) {
  std::lock_guard<std::mutex> l(mu);
  if (copied) return;
  copied = true;
  copy_status = std::move(s);
  cv.notify_all();
}

void SaveHandle::State::SetDone(absl::Status s) {
  std::lock_guard<std::mutex> l(mu);
  if (!copied) {
    copied = true;
    copy_status = s;
  }
  done = true;
  status = std::move(s);
  cv.notify_all();
}

SaveHandle::SaveHandle() = default;
SaveHandle::SaveHandle(std::shared_ptr<State> state)
    : state_(std::move(state)) {}
SaveHandle::SaveHandle(SaveHandle&&) noexcept = default;

SaveHandle& SaveHandle::operator=(SaveHandle&& other) noexcept {
  if (this != &other) {
    // Assignment cannot report: the old save's status is dropped, as the
    // destructor documents (it was the caller's to Wait for).
    if (state_) (void)Wait();
    state_ = std::move(other.state_);
  }
  return *this;
}

SaveHandle::~SaveHandle() {
  // Waits so the tensors are never read after the handle is gone; a
  // destructor cannot report, so the status is dropped (see client.h).
  if (state_) (void)Wait();
}

absl::Status SaveHandle::WaitCopied() {
  if (!state_)
    return absl::FailedPreconditionError("SaveHandle: not attached to a save");
  std::unique_lock<std::mutex> l(state_->mu);
  state_->cv.wait(l, [&] { return state_->copied; });
  return state_->copy_status;
}

absl::Status SaveHandle::Wait() {
  if (!state_)
    return absl::FailedPreconditionError("SaveHandle: not attached to a save");
  std::unique_lock<std::mutex> l(state_->mu);
  state_->cv.wait(l, [&] { return state_->done; });
  return state_->status;
}

// ---- Client ----

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  CKPT_RETURN_IF_ERROR(options.ResolveFromEnvironment());
  CKPT_ASSIGN_OR_RETURN(auto stub,
                        client::DaemonStub::Connect(options.socket_path,
                                                    std::chrono::seconds(10)));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(stub));
  CKPT_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options(); }

absl::Status Client::Save(int64_t step, std::span<const Tensor> tensors) {
  return Save(step, tensors, SaveOptions());
}

absl::Status Client::Save(int64_t step, std::span<const Tensor> tensors,
                          const SaveOptions& options) {
  CKPT_ASSIGN_OR_RETURN(SaveHandle handle,
                        impl_->SaveAsync(step, tensors, options));
  return handle.Wait();
}

absl::StatusOr<SaveHandle> Client::SaveAsync(int64_t step,
                                             std::span<const Tensor> tensors) {
  return impl_->SaveAsync(step, tensors, SaveOptions());
}

absl::StatusOr<SaveHandle> Client::SaveAsync(int64_t step,
                                             std::span<const Tensor> tensors,
                                             const SaveOptions& options) {
  return impl_->SaveAsync(step, tensors, options);
}

absl::StatusOr<int64_t> Client::LatestStep() { return impl_->LatestStep(); }

absl::Status Client::Restore(int64_t step, std::span<const Tensor> tensors) {
  return impl_->Restore(step, tensors, nullptr);
}

absl::Status Client::Restore(
    int64_t step, std::span<const Tensor> tensors,
    std::vector<std::optional<TensorLayout>>* layouts) {
  return impl_->Restore(step, tensors, layouts);
}

absl::Status Client::RestoreSavedRank(int64_t step, uint32_t saved_rank,
                                      std::span<const Tensor> tensors) {
  return impl_->Restore(step, tensors, nullptr, saved_rank);
}

absl::StatusOr<int64_t> Client::RestoreLatest(std::span<const Tensor> tensors) {
  return impl_->RestoreLatest(tensors);
}

absl::Status Client::WaitDurable(int64_t step,
                                 std::chrono::milliseconds timeout) {
  return impl_->WaitDurable(step, timeout);
}

SaveStats Client::last_save_stats() const { return impl_->last_save_stats(); }
RestoreStats Client::last_restore_stats() const {
  return impl_->last_restore_stats();
}

namespace {
// Non-negative finite seconds as whole units of `per_s`; 0 for anything
// else (a NaN, a negative time), and capped at `max`.
uint64_t SecondsTo(double seconds, double per_s, uint64_t max) {
  if (!(seconds > 0)) return 0;
  double units = seconds * per_s;
  return units >= static_cast<double>(max) ? max : static_cast<uint64_t>(units);
}
}  // namespace

void Client::Progress(int64_t step) { impl_->beacon().Progress(step, 0); }

void Client::Progress(int64_t step, double compute_s) {
  impl_->beacon().Progress(step, SecondsTo(compute_s, 1e9, UINT64_MAX / 2));
}

void Client::ExpectPause(double seconds, std::string_view reason) {
  impl_->beacon().ExpectPause(SecondsTo(seconds, 1e3, shm::kMaxPauseMs),
                              std::string(reason));
}

// ---- Client::Impl: lifetime and arenas ----

namespace client {

bool SegmentIdentity(const std::string& name, dev_t* dev, ino_t* ino) {
  struct stat st {};
  // POSIX shared memory lives in /dev/shm on Linux (glibc's shm_open); an
  // arena on hugetlbfs is named by its path.
  const bool path = name.find('/', 1) != std::string::npos;
  if (::stat((path ? name : "/dev/shm" + name).c_str(), &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

bool MappedArena::IsCurrent() const {
  dev_t d = 0;
  ino_t i = 0;
  return SegmentIdentity(arena->name(), &d, &i) && d == dev && i == ino;
}

MappedArena::~MappedArena() {
  if (pinned_by == nullptr) return;
  absl::Status s = pinned_by->UnregisterHost(arena->slot_data(0));
  if (!s.ok())
    std::fprintf(stderr, "libckpt: unpin arena %s: %s\n", arena->name().c_str(),
                 std::string(s.message()).c_str());
}

}  // namespace client

Client::Impl::Impl(ClientOptions options,
                   std::unique_ptr<client::DaemonStub> stub)
    : options_(std::move(options)),
      stub_(std::move(stub)),
      engine_(options_.copy_threads),
      devices_(client::NewDeviceCopier()) {
  file_restorer_ =
      std::make_unique<client::FileRestorer>(&engine_, devices_.get());
  saver_ = std::thread([this] { SaverLoop(); });
}

Client::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  saver_.join();
}

absl::Status Client::Impl::Start() {
  if (options_.slot_bytes == 0) return absl::OkStatus();
  return SaveArena(0).status();
}

SaveStats Client::Impl::last_save_stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

RestoreStats Client::Impl::last_restore_stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return restore_stats_;
}

absl::StatusOr<std::shared_ptr<client::MappedArena>> Client::Impl::SaveArena(
    uint64_t image_bytes) {
  std::lock_guard<std::mutex> l(arena_mu_);
  // Another process of this rank may have made the daemon replace the arena
  // (a bigger Register): never write into a segment nobody reads.
  if (save_arena_ && !save_arena_->IsCurrent()) save_arena_.reset();
  if (save_arena_ && save_arena_->arena->slot_bytes() >= image_bytes)
    return save_arena_;
  if (save_arena_ && options_.slot_bytes > 0)
    return absl::ResourceExhaustedError(absl::StrCat(
        "save: the shard image needs ", image_bytes,
        " bytes, but a slot holds ", save_arena_->arena->slot_bytes(),
        " bytes (options.slot_bytes = ", options_.slot_bytes, ")"));
  uint64_t want = options_.slot_bytes;
  if (want == 0)
    want = static_cast<uint64_t>(std::ceil(static_cast<double>(image_bytes) *
                                           (1.0 + options_.slot_headroom)));
  v1::RegisterRequest req;
  req.set_job(options_.job);
  req.set_rank(static_cast<uint32_t>(options_.rank));
  req.set_world_size(static_cast<uint32_t>(options_.world_size));
  req.set_slot_bytes(std::max(want, image_bytes));
  req.set_num_slots(static_cast<uint32_t>(options_.num_slots));
  if (options_.generation) req.set_generation(*options_.generation);
  CKPT_ASSIGN_OR_RETURN(v1::RegisterResponse resp, stub_->Register(req));
  CKPT_ASSIGN_OR_RETURN(
      auto arena,
      ArenaLocked(resp.shm_name(), resp.arena_bytes(), resp.slots_offset()));
  if (arena->arena->slot_bytes() != resp.slot_bytes() ||
      arena->arena->num_slots() != resp.num_slots())
    return absl::DataLossError(absl::StrCat(
        "Register: arena ", resp.shm_name(), " has ", arena->arena->num_slots(),
        " slots of ", arena->arena->slot_bytes(), " bytes, the daemon said ",
        resp.num_slots(), " of ", resp.slot_bytes()));
  if (arena->arena->slot_bytes() < image_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("save: the shard image needs ", image_bytes,
                     " bytes, but a slot of arena ", resp.shm_name(), " holds ",
                     arena->arena->slot_bytes(), " bytes"));
  save_arena_ = arena;
  if (restore_arena_ == arena) restore_arena_.reset();
  return arena;
}

absl::StatusOr<std::shared_ptr<client::MappedArena>> Client::Impl::ArenaLocked(
    const std::string& name, uint64_t arena_bytes, uint64_t slots_offset) {
  for (const auto& a : {save_arena_, restore_arena_}) {
    if (a && a->arena->name() == name && a->arena->size() == arena_bytes &&
        a->IsCurrent())
      return a;
  }
  auto mapped = std::make_shared<client::MappedArena>();
  // The identity read before and after the mapping must agree, else the
  // segment was replaced in between and the mapping may be the old one.
  bool known = client::SegmentIdentity(name, &mapped->dev, &mapped->ino);
  CKPT_ASSIGN_OR_RETURN(mapped->arena,
                        shm::Arena::Attach(name, arena_bytes, slots_offset));
  if (!known || !mapped->IsCurrent())
    return absl::AbortedError(absl::StrCat(
        "arena ", name, ": replaced by the daemon while attaching; retry"));
  beacon_.Attach(name, mapped->dev, mapped->ino);
  if (devices_->HasDevice()) {
    const shm::Arena& a = *mapped->arena;
    absl::Status s =
        devices_->RegisterHost(a.slot_data(0), a.size() - a.slot_offset(0));
    // Unpinned memory still works, at pageable-copy speed.
    if (s.ok())
      mapped->pinned_by = devices_.get();
    else
      std::fprintf(stderr, "libckpt: cannot pin arena %s: %s\n", name.c_str(),
                   std::string(s.message()).c_str());
  }
  return mapped;
}

}  // namespace ckpt
