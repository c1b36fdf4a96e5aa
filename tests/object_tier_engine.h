// ObjectTierEngineTest: the fixture of the in-process object tier tests
// (object_tier_engine_test.cc, object_tier_resave_test.cc). An Engine over
// a local directory (behind local_gate_, a GatedBackend) with a second
// directory as the object tier, behind gate_ (over a FaultInjectionBackend
// when asked); saves of a one-tensor shard by rank 0 or 1 as a client
// would (tests/engine_save.h). One test thread.
#ifndef CKPT_TESTS_OBJECT_TIER_ENGINE_H_
#define CKPT_TESTS_OBJECT_TIER_ENGINE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/fault_backend.h"
#include "storage/keys.h"
#include "tests/engine_save.h"
#include "tests/gated_backend.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {

using daemon::Catalog;
using daemon::Engine;
using daemon::EngineOptions;
using daemon::PeerCreds;

class ObjectTierEngineTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (gate_) gate_->Open();
    if (local_gate_) local_gate_->Open();
    Close();
    arena_.reset();
    arena1_.reset();
    UnlinkArenas(prefix_);
  }
  void Open(EngineOptions::CommitTier tier, uint32_t retain_local,
            uint32_t retain_object, bool faulty = false) {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/local";
    lo.use_io_uring = local_io_uring_;
    local_ = std::move(*storage::NewLocalBackend(lo));
    local_gate_ = std::make_unique<GatedBackend>(local_.get());
    lo.root = dir_.path() + "/object";
    lo.direct_io = false;
    object_dir_ = std::move(*storage::NewLocalBackend(lo));
    fault_ =
        std::make_unique<storage::FaultInjectionBackend>(object_dir_.get());
    gate_ = std::make_unique<GatedBackend>(
        faulty ? static_cast<storage::Backend*>(fault_.get())
               : object_dir_.get());
    auto cat = Catalog::Open(dir_.path() + "/.catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.huge_dir = huge_dir_;
    eo.retain_steps = retain_local;
    eo.retain_object = retain_object;
    eo.commit_tier = tier;
    eo.upload_threads = 2;
    eo.on_fallback = [this](const daemon::FallbackReport& f) {
      std::lock_guard<std::mutex> l(fallbacks_mu_);
      fallbacks_.push_back(f);
    };
    auto e = Engine::Open(eo, local_gate_.get(), catalog_.get(),
                          no_object_tier_ ? nullptr : gate_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void Close() {
    engine_.reset();
    catalog_.reset();
  }
  // Saves a 64 KiB tensor filled with `step`, writing the slot as a client.
  absl::Status SaveStep(uint64_t step) {
    return SaveOneTensorStep(engine_.get(), peer_, {"tier", step}, &arena_);
  }
  // The same by `rank` of a job of two ranks, the tensor filled with `fill`.
  absl::Status SaveRank(uint64_t step, uint32_t rank, int fill) {
    OneTensorSave save{"tier", step};
    save.rank = rank;
    save.world_size = 2;
    save.fill = fill;
    save.block = true;  // a slot frees once the previous step is on disk
    return SaveOneTensorStep(engine_.get(), peer_, save,
                             rank == 0 ? &arena_ : &arena1_);
  }
  absl::Status WaitDurable(uint64_t step, int timeout_ms = 20000) {
    v1::WaitDurableRequest w;
    w.set_job("tier");
    w.set_step(step);
    w.set_timeout_ms(timeout_ms);
    return engine_->WaitDurable(peer_, w);
  }
  v1::StatusResponse Status() { return engine_->Status(peer_); }
  bool InObjectTier(const std::string& key) {
    return object_dir_->Stat(key).ok();
  }
  std::string Manifest(uint64_t step) {
    return storage::ManifestKey("tier", step);
  }
  std::string ShardKey(uint64_t step, uint32_t rank = 0) {
    return storage::ShardKey("tier", step, rank);
  }
  // Waits (no time limit of its own: the test's timeout) until pred holds.
  template <typename Pred>
  void Eventually(Pred pred) {
    while (!pred()) usleep(10000);
  }
  // Whether pred holds within `limit` (for what a bug would never do).
  template <typename Pred>
  bool Within(std::chrono::seconds limit, Pred pred) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > until) return false;
      usleep(10000);
    }
    return true;
  }
  std::string Read(storage::Backend& b, const std::string& key) {
    auto size = b.ObjectSize(key);
    EXPECT_TRUE(size.ok()) << size.status();
    std::string out(size.ok() ? *size : 0, '\0');
    EXPECT_TRUE(b.ReadAt(key, 0, out.data(), out.size()).ok());
    return out;
  }
  absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(
      uint64_t step, bool allow_file_read = false) {
    v1::OpenRestoreRequest req;
    req.set_job("tier");
    req.set_step(step);
    req.set_allow_file_read(allow_file_read);
    return engine_->OpenRestore(peer_, req);
  }
  // Ends a restore as a client does, naming the copy bad if `bad` is set.
  absl::Status CloseRestore(uint64_t step, uint64_t lease,
                            const std::string& bad = "") {
    v1::CloseRestoreRequest req;
    req.set_job("tier");
    req.set_step(step);
    req.set_lease(lease);
    req.set_bad_copy(bad);
    return engine_->CloseRestore(peer_, req);
  }
  std::vector<daemon::FallbackReport> Fallbacks() {
    std::lock_guard<std::mutex> l(fallbacks_mu_);
    return fallbacks_;
  }

  TempDir dir_;
  std::string prefix_ = UniqueShmPrefix();
  PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<storage::Backend> local_, object_dir_;
  std::unique_ptr<GatedBackend> local_gate_;
  bool no_object_tier_ = false;  // set before Open: the engine gets none
  // Set before Open: the engine's hugetlbfs for arenas ("": /dev/shm), and
  // whether the local tier registers arenas with io_uring (which pins, and
  // so faults in, every page of an arena).
  std::string huge_dir_;
  bool local_io_uring_ = true;
  std::unique_ptr<storage::FaultInjectionBackend> fault_;
  std::unique_ptr<GatedBackend> gate_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arena_, arena1_;  // ranks 0 and 1
  std::mutex fallbacks_mu_;
  std::vector<daemon::FallbackReport> fallbacks_;  // on_fallback's reports
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_OBJECT_TIER_ENGINE_H_
