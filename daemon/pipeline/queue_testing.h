// Test helpers for the daemon's storage queues (persister, uploader,
// pipeline, shard drops): an event log a test waits on, and a real
// backend wrapped to record its deletes and writes into it and to fail
// the ones a test names. Test-only; thread-safe.
#ifndef CKPT_DAEMON_PIPELINE_QUEUE_TESTING_H_
#define CKPT_DAEMON_PIPELINE_QUEUE_TESTING_H_

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "storage/backend.h"

namespace ckpt::daemon::testing {

// What happened, in order, as lines.
class EventLog {
 public:
  void Add(std::string line) {
    absl::MutexLock l(&mu_);
    lines_.push_back(std::move(line));
  }
  std::vector<std::string> lines() const {
    absl::MutexLock l(&mu_);
    return lines_;
  }
  // Returns once `n` lines were logged; then the first n lines.
  std::vector<std::string> AwaitLines(size_t n) const {
    absl::MutexLock l(&mu_);
    struct Arg {
      const std::vector<std::string>* lines;
      size_t n;
    } arg{&lines_, n};
    mu_.Await(absl::Condition(
        +[](Arg* a) { return a->lines->size() >= a->n; }, &arg));
    return {lines_.begin(), lines_.begin() + static_cast<ptrdiff_t>(n)};
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// A real local backend whose deletes (and small writes) are logged as
// "delete KEY", "delete-prefix PREFIX", "put KEY"; a delete or put of a
// key in Fail() fails (Unavailable) until Heal().
class RecordingBackend : public storage::BackendWrapper {
 public:
  RecordingBackend(storage::Backend* target, EventLog* log)
      : BackendWrapper(target), log_(log) {}
  absl::Status Delete(std::string_view key) override {
    log_->Add(absl::StrCat("delete ", std::string(key)));
    if (Failing(key)) return absl::UnavailableError("refused by the test");
    return BackendWrapper::Delete(key);
  }
  absl::Status DeletePrefix(std::string_view prefix) override {
    log_->Add(absl::StrCat("delete-prefix ", std::string(prefix)));
    if (Failing(prefix)) return absl::UnavailableError("refused by the test");
    return BackendWrapper::DeletePrefix(prefix);
  }
  absl::Status PutSmallObject(std::string_view key,
                              std::string_view contents) override {
    log_->Add(absl::StrCat("put ", std::string(key)));
    if (Failing(key)) return absl::UnavailableError("refused by the test");
    return BackendWrapper::PutSmallObject(key, contents);
  }
  void Fail(std::string key) {
    absl::MutexLock l(&mu_);
    failing_.insert(std::move(key));
  }
  void Heal() {
    absl::MutexLock l(&mu_);
    failing_.clear();
  }

 private:
  bool Failing(std::string_view key) {
    absl::MutexLock l(&mu_);
    return failing_.count(std::string(key)) > 0;
  }
  EventLog* const log_;
  absl::Mutex mu_;
  std::set<std::string> failing_ ABSL_GUARDED_BY(mu_);
};

// A local backend rooted in a fresh directory.
inline std::unique_ptr<storage::Backend> NewLocal(const std::string& root) {
  storage::LocalBackendOptions o;
  o.root = root;
  auto b = storage::NewLocalBackend(o);
  if (!b.ok()) abort();
  return std::move(*b);
}

inline bool Exists(storage::Backend& b, const std::string& key) {
  return b.Stat(key).ok();
}

}  // namespace ckpt::daemon::testing

#endif  // CKPT_DAEMON_PIPELINE_QUEUE_TESTING_H_
