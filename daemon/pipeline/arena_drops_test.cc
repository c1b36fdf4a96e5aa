// ArenaDrops alone, with real arenas and a real local backend: a drop
// unregisters the arena's memory (when registered) before it unlinks the
// name (when asked); AwaitUnlinked holds a creator back while an unlink of
// its name is queued; a drop without unlink leaves the name; the
// destructor finishes what is queued.
#include "daemon/pipeline/arena_drops.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/pipeline/queue_testing.h"
#include "shm/arena.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

// Logs "unregister" (and "unlinked"/"named": the arena's name then) and
// can hold UnregisterMemory until released.
class HoldingBackend : public storage::BackendWrapper {
 public:
  HoldingBackend(storage::Backend* target, testing::EventLog* log)
      : BackendWrapper(target), log_(log) {}
  void UnregisterMemory(void* base) override {
    log_->Add(absl::StrCat("unregister ", Named(name_) ? "named" : "unlinked"));
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !hold_; });
    l.unlock();
    BackendWrapper::UnregisterMemory(base);
  }
  void Hold() {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> l(mu_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  static bool Named(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd >= 0) close(fd);
    return fd >= 0;
  }
  std::string name_;  // set before the drop

 private:
  testing::EventLog* const log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
};

class ArenaDropsTest : public ::testing::Test {
 protected:
  ArenaDropsTest()
      : local_(testing::NewLocal(dir_.path())), backend_(local_.get(), &log_) {}
  void TearDown() override {
    for (const std::string& n : names_) (void)shm::Arena::Unlink(n);
  }
  std::shared_ptr<shm::Arena> NewArena() {
    shm::ArenaOptions o;
    static std::atomic<int> seq{0};
    o.name = absl::StrCat("/ckpt-ad-", ::getpid(), "-", seq++, ".j.r0");
    o.job = "j";
    o.rank = 0;
    o.world_size = 1;
    o.slot_bytes = 1 << 20;
    o.num_slots = 2;
    o.user_uid = getuid();
    names_.push_back(o.name);
    auto a = shm::Arena::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    backend_.name_ = o.name;
    return std::shared_ptr<shm::Arena>(std::move(*a));
  }

  ::ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> local_;
  testing::EventLog log_;
  HoldingBackend backend_;
  std::vector<std::string> names_;
};

TEST_F(ArenaDropsTest, ADropUnregistersThenUnlinks) {
  ArenaDrops drops(&backend_);
  std::shared_ptr<shm::Arena> arena = NewArena();
  const std::string name = arena->name();
  ASSERT_TRUE(
      backend_
          .RegisterMemory(arena->slot_data(0),
                          uint64_t{arena->num_slots()} * arena->slot_bytes())
          .ok());  // as the prefaulter does
  drops.Drop(std::move(arena), /*registered=*/true, /*unlink=*/true);
  drops.Flush();
  EXPECT_EQ(log_.lines(), std::vector<std::string>{"unregister named"});
  EXPECT_FALSE(HoldingBackend::Named(name));
}

TEST_F(ArenaDropsTest, AnUnlinkQueuedHoldsBackACreatorOfTheName) {
  ArenaDrops drops(&backend_);
  std::shared_ptr<shm::Arena> arena = NewArena();
  const std::string name = arena->name();
  backend_.Hold();
  drops.Drop(std::move(arena), /*registered=*/true, /*unlink=*/true);
  log_.AwaitLines(1);  // the drop is under way, held before its unlink
  auto creator = std::async(std::launch::async, [&] {
    drops.AwaitUnlinked(name);
    return HoldingBackend::Named(name);  // what a creator would find
  });
  EXPECT_TRUE(HoldingBackend::Named(name));
  backend_.Release();
  EXPECT_FALSE(creator.get());  // it returned only once the name was gone
  drops.AwaitUnlinked("/some-other-name");  // none queued: at once
}

TEST_F(ArenaDropsTest, ADropWithoutUnlinkKeepsTheName) {
  ArenaDrops drops(&backend_);
  std::shared_ptr<shm::Arena> arena = NewArena();
  const std::string name = arena->name();
  drops.Drop(std::move(arena), /*registered=*/false, /*unlink=*/false);
  drops.Flush();
  EXPECT_TRUE(log_.lines().empty());  // never registered: not unregistered
  EXPECT_TRUE(HoldingBackend::Named(name));
}

TEST_F(ArenaDropsTest, TheDestructorFinishesWhatIsQueued) {
  std::string name;
  {
    ArenaDrops drops(&backend_);
    std::shared_ptr<shm::Arena> arena = NewArena();
    name = arena->name();
    drops.Drop(std::move(arena), /*registered=*/false, /*unlink=*/true);
  }
  EXPECT_FALSE(HoldingBackend::Named(name));
}

}  // namespace
}  // namespace ckpt::daemon
