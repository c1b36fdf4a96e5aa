// The engine in-process (this test is the daemon) with a hugetlbfs for its
// arenas: a registration gets an arena in 2 MiB pages, named by its path,
// which the client attaches and the engine persists from and counts
// (ckptd_arenas_huge_pages); a job's uid that truncates it fails the shard
// naming the arena without killing the process; with no free huge pages
// the arena falls back to /dev/shm. The pools come from
// tests/huge_page_pool.h (root: a few pages reserved through
// /proc/sys/vm/nr_hugepages and given back; the tests skip otherwise).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "daemon/core/catalog.h"
#include "daemon/core/metrics.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "tests/engine_save.h"
#include "tests/harness.h"
#include "tests/huge_page_pool.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using daemon::Engine;
using daemon::PeerCreds;

// A 4 MiB slot, two of them, and the header: 5 pages of 2 MiB.
constexpr long kArenaPages = 5;

class HugeArenaEngineTest : public ::testing::Test {
 protected:
  void Open(const std::string& huge_dir) {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/root";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    auto cat = daemon::Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.huge_dir = huge_dir;
    eo.metrics = metrics_;
    auto e = Engine::Open(eo, local_.get(), catalog_.get(), nullptr);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    engine_.reset();
    catalog_.reset();
    arena_.reset();
    UnlinkArenas(prefix_);
  }
  absl::Status WaitDurable(uint64_t step) {
    v1::WaitDurableRequest w;
    w.set_job("job");
    w.set_step(step);
    w.set_timeout_ms(60000);
    return engine_->WaitDurable(peer_, w);
  }
  // The gauge ckptd_arenas_huge_pages{ckpt_job="job"}, as a scrape sees
  // it; -1 if absent.
  double HugeArenas() {
    for (const auto& family : metrics_->Collect()) {
      if (family.name != "ckptd_arenas_huge_pages") continue;
      for (const auto& m : family.metric)
        for (const auto& l : m.label)
          if (l.name == "ckpt_job" && l.value == "job") return m.gauge.value;
    }
    return -1;
  }
  std::string ShardFile() {
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(dir_.path() + "/root"))
      if (e.path().extension() == ".shard") {
        std::ifstream f(e.path(), std::ios::binary);
        return {std::istreambuf_iterator<char>(f), {}};
      }
    return {};
  }

  TempDir dir_;
  const std::string prefix_ = UniqueShmPrefix();
  const PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<daemon::Catalog> catalog_;
  std::shared_ptr<daemon::DaemonMetrics> metrics_ =
      std::make_shared<daemon::DaemonMetrics>();
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arena_;  // the job's mapping
};

TEST_F(HugeArenaEngineTest, ArenaIsInHugePagesAndPersistsFromThem) {
  HugePagePool pool(kArenaPages);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  Open(pool.dir());
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 1, .fill = 0x5a},
                                &arena_)
                  .ok());
  EXPECT_EQ(arena_->name(), pool.dir() + "/" + prefix_ + ".job.r0");
  EXPECT_TRUE(arena_->huge_pages());
  EXPECT_EQ(HugeArenas(), 1.0);
  ASSERT_TRUE(WaitDurable(1).ok());
  const std::string shard = ShardFile();
  EXPECT_NE(shard.find(std::string(64 << 10, '\x5a')), std::string::npos);
}

TEST_F(HugeArenaEngineTest, TruncatedHugeArenaIsReplacedAndTheDaemonServes) {
  HugePagePool pool(2 * kArenaPages);  // the replacement's pages too
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  Open(pool.dir());
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 1, .fill = 0x5a},
                                &arena_)
                  .ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  // The job's uid truncates it: the engine's mapping is guarded, and the
  // next registration replaces the arena.
  int fd = open(arena_->name().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  arena_.reset();
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  std::unique_ptr<shm::Arena> again;
  // Register replaces a truncated arena; the save lands in the new one.
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 2, .fill = 0x6b}, &again)
                  .ok());
  EXPECT_TRUE(again->huge_pages());
  EXPECT_TRUE(WaitDurable(2).ok());
  EXPECT_TRUE(engine_->WaitIdle(std::chrono::seconds(30)));
}

TEST_F(HugeArenaEngineTest, WithoutFreeHugePagesTheArenaIsInDevShm) {
  HugePagePool pool(0);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  if (HugePagePool::FreePages() >= kArenaPages)
    GTEST_SKIP() << "this machine has free huge pages already";
  Open(pool.dir());
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 1, .fill = 0x5a},
                                &arena_)
                  .ok());
  EXPECT_EQ(arena_->name(), "/" + prefix_ + ".job.r0");
  EXPECT_FALSE(arena_->huge_pages());
  EXPECT_EQ(HugeArenas(), 0.0);
  EXPECT_TRUE(WaitDurable(1).ok());
}

}  // namespace
}  // namespace ckpt::testing
