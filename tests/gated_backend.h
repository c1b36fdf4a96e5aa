// GatedBackend: a storage::BackendWrapper for the in-process engine tests
// that holds every new object (writers and small objects) whose key
// contains a chosen part (every key by default) while the gate is closed,
// can hold one writer's Commit (its bytes written, not yet visible), and
// records the order of deletes; it can also hold UnregisterMemory (an
// arena's drop), Stat (a metadata call to a slow shared root) and
// NewObjectReader (a load that has not begun reading), and counts
// RegisterMemory. Every method is thread-safe; the
// held calls wait on the gate's own lock.
#ifndef CKPT_TESTS_GATED_BACKEND_H_
#define CKPT_TESTS_GATED_BACKEND_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "storage/backend.h"

namespace ckpt::testing {

class GatedBackend : public storage::BackendWrapper {
 public:
  explicit GatedBackend(Backend* target) : BackendWrapper(target) {}
  using BackendWrapper::NewObjectWriter;
  // Closes the gate for keys containing `part` ("" = every key).
  void Close(std::string part = "") {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
    part_ = std::move(part);
  }
  // Opens the gate and releases a held Commit.
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
      commit_open_ = true;
    }
    cv_.notify_all();
  }
  // The next writer of a key containing `part` waits in Commit until
  // ReleaseCommit().
  void HoldNextCommit(std::string part) {
    std::lock_guard<std::mutex> l(mu_);
    hold_part_ = std::move(part);
    hold_armed_ = true;
    commit_open_ = false;
  }
  void ReleaseCommit() {
    {
      std::lock_guard<std::mutex> l(mu_);
      commit_open_ = true;
    }
    cv_.notify_all();
  }
  // Calls held at the gate now (new objects, and the held Commit).
  int waiting() {
    std::lock_guard<std::mutex> l(mu_);
    return waiting_;
  }
  std::vector<std::string> deletes() {
    std::lock_guard<std::mutex> l(mu_);
    return deletes_;
  }
  // UnregisterMemory waits until ReleaseUnregister(); unregistering()
  // counts the calls waiting.
  void HoldUnregister() { Close(unregister_); }
  void ReleaseUnregister() { Open(unregister_); }
  int unregistering() { return Waiting(unregister_); }
  // Stat waits until ReleaseStat(); stating() counts the calls waiting.
  void HoldStat() { Close(stat_); }
  void ReleaseStat() { Open(stat_); }
  int stating() { return Waiting(stat_); }
  // Return once `n` Stat / UnregisterMemory calls are held, once `n`
  // RegisterMemory calls succeeded.
  // NewObjectReader waits until ReleaseReads(); AwaitReading(n) returns
  // once `n` calls are held.
  void HoldReads() { Close(read_); }
  void ReleaseReads() { Open(read_); }
  void AwaitReading(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return read_.waiting >= n; });
  }
  void AwaitStating(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return stat_.waiting >= n; });
  }
  void AwaitUnregistering(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return unregister_.waiting >= n; });
  }
  void AwaitRegistered(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return registered_ >= n; });
  }
  absl::StatusOr<std::unique_ptr<storage::ObjectReader>> NewObjectReader(
      std::string_view key) override {
    Pass(read_);
    return target()->NewObjectReader(key);
  }
  absl::StatusOr<storage::ObjectInfo> Stat(std::string_view key) override {
    Pass(stat_);
    return target()->Stat(key);
  }
  // RegisterMemory calls that succeeded.
  int registered() {
    std::lock_guard<std::mutex> l(mu_);
    return registered_;
  }
  absl::Status RegisterMemory(void* base, uint64_t len) override {
    absl::Status s = target()->RegisterMemory(base, len);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (s.ok()) ++registered_;
    }
    cv_.notify_all();
    return s;
  }
  void UnregisterMemory(void* base) override {
    Pass(unregister_);
    target()->UnregisterMemory(base);
  }
  absl::StatusOr<std::unique_ptr<storage::ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const storage::WriterOptions& o) override {
    Wait(key);
    auto w = target()->NewObjectWriter(key, size, o);
    std::lock_guard<std::mutex> l(mu_);
    if (!w.ok() || !hold_armed_ ||
        key.find(hold_part_) == std::string_view::npos)
      return w;
    hold_armed_ = false;
    return std::unique_ptr<storage::ObjectWriter>(
        std::make_unique<HeldWriter>(this, std::move(*w)));
  }
  absl::Status PutSmallObject(std::string_view key,
                              std::string_view contents) override {
    Wait(key);
    return target()->PutSmallObject(key, contents);
  }
  absl::Status Delete(std::string_view key) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      deletes_.emplace_back(key);
    }
    return target()->Delete(key);
  }

 private:
  // One kind of call held while closed: those waiting are counted.
  struct Hold {
    bool open = true;
    int waiting = 0;
  };
  void Close(Hold& h) {
    std::lock_guard<std::mutex> l(mu_);
    h.open = false;
  }
  void Open(Hold& h) {
    {
      std::lock_guard<std::mutex> l(mu_);
      h.open = true;
    }
    cv_.notify_all();
  }
  int Waiting(const Hold& h) {
    std::lock_guard<std::mutex> l(mu_);
    return h.waiting;
  }
  void Pass(Hold& h) {
    std::unique_lock<std::mutex> l(mu_);
    ++h.waiting;
    cv_.notify_all();  // for the Await* of a test
    cv_.wait(l, [&] { return h.open; });
    --h.waiting;
  }

  // Its Commit waits for ReleaseCommit().
  class HeldWriter : public storage::ObjectWriter {
   public:
    HeldWriter(GatedBackend* gate, std::unique_ptr<storage::ObjectWriter> w)
        : gate_(gate), w_(std::move(w)) {}
    absl::Status WriteAt(uint64_t offset, const void* data,
                         uint64_t len) override {
      return w_->WriteAt(offset, data, len);
    }
    absl::Status Commit() override {
      {
        std::unique_lock<std::mutex> l(gate_->mu_);
        ++gate_->waiting_;
        gate_->cv_.wait(l, [&] { return gate_->commit_open_; });
        --gate_->waiting_;
      }
      return w_->Commit();
    }
    void Abort() override { w_->Abort(); }

   private:
    GatedBackend* const gate_;
    std::unique_ptr<storage::ObjectWriter> w_;
  };

  void Wait(std::string_view key) {
    std::unique_lock<std::mutex> l(mu_);
    ++waiting_;
    cv_.wait(
        l, [&] { return open_ || key.find(part_) == std::string_view::npos; });
    --waiting_;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::string part_;
  int waiting_ = 0;
  std::string hold_part_;
  bool hold_armed_ = false;
  bool commit_open_ = true;
  std::vector<std::string> deletes_;
  Hold unregister_;
  Hold stat_;
  Hold read_;
  int registered_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_GATED_BACKEND_H_
