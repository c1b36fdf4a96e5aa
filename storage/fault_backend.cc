#include "storage/fault_backend.h"

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status.h"
#include "util/strings.h"

// Counting: every WriteAt counts as one write and every Commit as one commit;
// PutSmallObject counts as one write and one commit, since it is both.
namespace ckpt::storage {
namespace {

absl::Status Crashed() {
  return absl::UnavailableError(
      "fault injection: simulated crash; call Restart()");
}

}  // namespace

// One writer's forwarding state. Its mutex orders the writer's own calls
// against SimulateCrash, which aborts it from another thread.
struct FaultWriterCore {
  std::mutex mu;
  std::unique_ptr<ObjectWriter> base;
  std::string key;
  absl::Status poisoned;  // a failed write: the object can no longer commit
  bool finished = false;  // committed or aborted
};

struct FaultInjectionBackend::State {
  std::mutex mu;
  std::condition_variable released;  // hang_writes went false
  bool crashed = false;
  bool hang_writes = false;
  int write_countdown = 0, write_err = 0;
  int commit_countdown = 0, commit_err = 0;
  bool space_limited = false;
  uint64_t space_left = 0;
  std::vector<std::weak_ptr<FaultWriterCore>> writers;

  // The injected failure of the next write of len bytes, if any.
  absl::Status NextWrite(std::string_view key, uint64_t len) {
    std::unique_lock<std::mutex> lock(mu);
    released.wait(lock, [this] { return !hang_writes; });
    if (crashed) return Crashed();
    if (write_countdown > 0 && --write_countdown == 0)
      return ErrnoToStatus(write_err,
                           absl::StrCat(AV(key), ": injected write failure"));
    if (space_limited) {
      if (len > space_left)
        return ErrnoToStatus(
            ENOSPC, absl::StrFormat(
                        "%s: write of %d bytes past the space limit (%d left)",
                        AV(key), len, space_left));
      space_left -= len;
    }
    return absl::OkStatus();
  }
  absl::Status NextCommit(std::string_view key) {
    std::lock_guard<std::mutex> lock(mu);
    if (crashed) return Crashed();
    if (commit_countdown > 0 && --commit_countdown == 0)
      return ErrnoToStatus(commit_err,
                           absl::StrCat(AV(key), ": injected commit failure"));
    return absl::OkStatus();
  }
  absl::Status Alive() {
    std::lock_guard<std::mutex> lock(mu);
    return crashed ? Crashed() : absl::OkStatus();
  }
};

namespace {

class FaultWriter : public ObjectWriter {
 public:
  FaultWriter(std::shared_ptr<FaultInjectionBackend::State> state,
              std::shared_ptr<FaultWriterCore> core)
      : state_(std::move(state)), core_(std::move(core)) {}
  ~FaultWriter() override { Abort(); }

  absl::Status WriteAt(uint64_t offset, const void* data,
                       uint64_t len) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    CKPT_RETURN_IF_ERROR(Usable());
    absl::Status s = state_->NextWrite(core_->key, len);
    if (s.ok()) s = core_->base->WriteAt(offset, data, len);
    if (!s.ok()) core_->poisoned = s;
    return s;
  }

  absl::Status Commit() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    CKPT_RETURN_IF_ERROR(Usable());
    absl::Status s = core_->poisoned;
    if (s.ok()) s = state_->NextCommit(core_->key);
    if (s.ok()) s = core_->base->Commit();
    if (!s.ok())
      core_->base->Abort();  // a failed commit leaves nothing visible
    core_->finished = true;
    return s;
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->finished) return;
    core_->base->Abort();
    core_->finished = true;
  }

 private:
  absl::Status Usable() {
    if (core_->finished)
      return absl::FailedPreconditionError(absl::StrCat(
          core_->key,
          ": writer already committed, aborted or lost in a crash"));
    return state_->Alive();
  }

  std::shared_ptr<FaultInjectionBackend::State> state_;
  std::shared_ptr<FaultWriterCore> core_;
};

// Every read checks the crash flag first; the bytes come from the target.
class FaultReader : public ObjectReader {
 public:
  FaultReader(std::shared_ptr<FaultInjectionBackend::State> state,
              std::unique_ptr<ObjectReader> base)
      : state_(std::move(state)), base_(std::move(base)) {}
  uint64_t size() const override { return base_->size(); }
  absl::Status ReadAt(uint64_t offset, void* dst, uint64_t len) override {
    CKPT_RETURN_IF_ERROR(state_->Alive());
    return base_->ReadAt(offset, dst, len);
  }
  absl::Status ReadAtNotify(uint64_t offset, void* dst, uint64_t len,
                            const Arrived& arrived) override {
    CKPT_RETURN_IF_ERROR(state_->Alive());
    return base_->ReadAtNotify(offset, dst, len, arrived);
  }
  absl::Status ReadAtNotifyToFile(uint64_t offset, void* dst, uint64_t len,
                                  const DestFile& file, const Arrived& arrived,
                                  const Received& received) override {
    CKPT_RETURN_IF_ERROR(state_->Alive());
    return base_->ReadAtNotifyToFile(offset, dst, len, file, arrived, received);
  }

 private:
  std::shared_ptr<FaultInjectionBackend::State> state_;
  std::unique_ptr<ObjectReader> base_;
};

}  // namespace

FaultInjectionBackend::FaultInjectionBackend(Backend* base)
    : BackendWrapper(base), state_(std::make_shared<State>()) {}
FaultInjectionBackend::~FaultInjectionBackend() = default;

void FaultInjectionBackend::FailNthWrite(int n, int err) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->write_countdown = n;
  state_->write_err = err;
}

void FaultInjectionBackend::FailNthCommit(int n, int err) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->commit_countdown = n;
  state_->commit_err = err;
}

void FaultInjectionBackend::SetSpaceLimit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->space_limited = true;
  state_->space_left = bytes;
}

void FaultInjectionBackend::HangWrites() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hang_writes = true;
}

void FaultInjectionBackend::ClearFaults() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->write_countdown = state_->commit_countdown = 0;
    state_->space_limited = false;
    state_->hang_writes = false;
  }
  state_->released.notify_all();
}

void FaultInjectionBackend::SimulateCrash() {
  std::vector<std::shared_ptr<FaultWriterCore>> live;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->crashed = true;
    for (auto& w : state_->writers)
      if (auto core = w.lock()) live.push_back(std::move(core));
    state_->writers.clear();
  }
  // Outside the state lock: a writer holds its own lock while asking the state.
  for (auto& core : live) {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->finished) continue;
    core->base->Abort();
    core->finished = true;
  }
}

void FaultInjectionBackend::Restart() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->crashed = false;
}

std::string FaultInjectionBackend::name() const {
  return absl::StrCat("fault(", target()->name(), ")");
}

absl::StatusOr<std::unique_ptr<ObjectWriter>>
FaultInjectionBackend::NewObjectWriter(std::string_view key, uint64_t size,
                                       const WriterOptions& options) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> base,
                        target()->NewObjectWriter(key, size, options));
  auto core = std::make_shared<FaultWriterCore>();
  core->base = std::move(base);
  core->key = std::string(key);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    std::erase_if(state_->writers, [](const std::weak_ptr<FaultWriterCore>& w) {
      return w.expired();
    });
    state_->writers.push_back(core);
  }
  return std::unique_ptr<ObjectWriter>(
      new FaultWriter(state_, std::move(core)));
}

absl::Status FaultInjectionBackend::PutSmallObject(std::string_view key,
                                                   std::string_view contents) {
  CKPT_RETURN_IF_ERROR(state_->NextWrite(key, contents.size()));
  CKPT_RETURN_IF_ERROR(state_->NextCommit(key));
  return target()->PutSmallObject(key, contents);
}

absl::StatusOr<std::unique_ptr<ObjectReader>>
FaultInjectionBackend::NewObjectReader(std::string_view key) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> base,
                        target()->NewObjectReader(key));
  return std::unique_ptr<ObjectReader>(
      new FaultReader(state_, std::move(base)));
}

absl::StatusOr<ObjectInfo> FaultInjectionBackend::Stat(std::string_view key) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  return target()->Stat(key);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionBackend::List(
    std::string_view prefix) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  return target()->List(prefix);
}

absl::Status FaultInjectionBackend::Delete(std::string_view key) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  return target()->Delete(key);
}

absl::Status FaultInjectionBackend::DeletePrefix(std::string_view prefix) {
  CKPT_RETURN_IF_ERROR(state_->Alive());
  return target()->DeletePrefix(prefix);
}

}  // namespace ckpt::storage
