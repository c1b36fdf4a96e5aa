// A load from the object tier into an arena created for it (the daemon
// restarted without its shared memory): which of the slot's pages are
// faulted in before the first byte is read. This process is the daemon
// (the engine in-process), so its own mapping of the arena is the
// daemon's; mincore(2) on it, while the load's read is held at the object
// tier's gate, says which pages the arena's creation faulted in.
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "shm/huge_pages.h"
#include "tests/huge_page_pool.h"
#include "tests/object_tier_engine.h"
#include "tests/smaps.h"

namespace ckpt::testing {
namespace {

// The start of this process's largest mapping of `path` at offset 0
// (the daemon's whole-arena mapping), or nullptr.
char* MappingOf(const std::string& path) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return nullptr;
  char line[1024];
  unsigned long best = 0, best_len = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0, off = 0;
    int name_at = 0;
    if (std::sscanf(line, "%lx-%lx %*s %lx %*s %*s %n", &lo, &hi, &off,
                    &name_at) < 3 ||
        name_at == 0)
      continue;
    std::string name(line + name_at);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
      name.pop_back();
    if (name.rfind(path, 0) != 0 || off != 0 || hi - lo <= best_len) continue;
    best = lo;
    best_len = hi - lo;
  }
  std::fclose(f);
  return reinterpret_cast<char*>(best);
}

// Pages of [p, p + bytes) that are resident: for a hugetlbfs mapping, those
// faulted into this process's page tables; for /dev/shm, those allocated in
// the segment.
long ResidentPages(char* p, uint64_t bytes) {
  std::vector<unsigned char> vec(bytes / 4096);
  if (mincore(p, bytes, vec.data()) != 0) return -1;
  long n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

class ObjectTierLoadTest : public ObjectTierEngineTest {
 protected:
  // Saves step 1, waits for its upload, and restarts the engine without
  // its shared memory or the local file: a restore of step 1 loads the
  // object into a new arena. `arena_path`: where that arena will be.
  void SaveUploadAndLoseAllButTheObject(const std::string& arena_path) {
    local_io_uring_ = false;  // registering would pin every page
    Open(EngineOptions::CommitTier::kLocal, 0, 0);
    ASSERT_TRUE(SaveStep(1).ok());
    ASSERT_TRUE(WaitDurable(1).ok());
    Eventually([&] {
      return InObjectTier(Manifest(1)) && Status().upload_backlog_steps() == 0;
    });
    Close();
    arena_.reset();
    ASSERT_TRUE(shm::Arena::Unlink(arena_path).ok());
    ASSERT_TRUE(local_->Delete(ShardKey(1)).ok());
    Open(EngineOptions::CommitTier::kLocal, 0, 0);
  }
  // Restores step 1 with the object's read held; `held` runs while it is,
  // with the daemon's mapping of the arena. The restore must then succeed
  // from the object tier with the object's bytes in its slot.
  void RestoreHeld(const std::string& arena_path,
                   const std::function<void(char* mapping)>& held) {
    gate_->HoldReads();
    absl::StatusOr<v1::OpenRestoreResponse> restored;
    std::thread restore([&] { restored = OpenRestore(1); });
    gate_->AwaitReading(1);
    char* mapping = MappingOf(arena_path);
    EXPECT_NE(mapping, nullptr) << arena_path;
    if (mapping != nullptr) held(mapping);
    gate_->ReleaseReads();
    restore.join();
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->source(), v1::RESTORE_SOURCE_OBJECT);
    std::ifstream f(dir_.path() + "/object/" + ShardKey(1), std::ios::binary);
    const std::string object{std::istreambuf_iterator<char>(f), {}};
    ASSERT_EQ(object.size(), restored->image_bytes());
    auto view = shm::Arena::Attach(restored->shm_name(),
                                   restored->arena_bytes(), shm::kSlotAlign);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(std::memcmp((*view)->base() + restored->slot_offset(),
                          object.data(), object.size()),
              0);
  }
};

// On hugetlbfs the mmap reserves every huge page of the arena, so a fault
// cannot run out of room: slot 0 is left for the load's writes to fault
// in as the bytes arrive, not zeroed in full before the first request.
TEST_F(ObjectTierLoadTest, HugetlbfsArenaForALoadLeavesSlotZeroToTheLoad) {
  HugePagePool pool(16);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  huge_dir_ = pool.dir();
  const std::string path = pool.dir() + "/" + prefix_ + ".tier.r0";
  SaveUploadAndLoseAllButTheObject(path);
  if (HasFatalFailure()) return;
  RestoreHeld(path, [&](char* mapping) {
    // The header is written at creation; slot 0 (one 2 MiB page here) is
    // not touched until the load writes it.
    EXPECT_GT(ResidentPages(mapping, shm::kSlotAlign), 0);
    EXPECT_EQ(ResidentPages(mapping + shm::kSlotAlign, shm::kSlotAlign), 0);
  });
}

// In /dev/shm only a reservation (fallocate) keeps a full /dev/shm from
// becoming a SIGBUS in the load: slot 0 is reserved before the load reads.
// Where /dev/shm gives no huge pages it is not faulted into the daemon's
// page tables: a load from the object tier writes it through the file
// (this tier's reader stores through the mapping, which faults the pages
// in as it goes); the restore still verifies and is bit-exact.
TEST_F(ObjectTierLoadTest, DevShmArenaForALoadReservesSlotZeroFirst) {
  const std::string path = "/" + prefix_ + ".tier.r0";
  SaveUploadAndLoseAllButTheObject(path);
  if (HasFatalFailure()) return;
  const bool small = absl::StartsWith(shm::ShmHugePagesOf("/dev/shm"), "off");
  RestoreHeld("/dev/shm" + path, [&](char* mapping) {
    // Allocated in the segment (fallocate): the header and slot 0. mincore
    // does not count a tmpfs page that fallocate allocated and nothing
    // wrote; the segment's blocks do.
    const auto* h = reinterpret_cast<const shm::ArenaHeader*>(mapping);
    struct stat st {};
    ASSERT_EQ(::stat(("/dev/shm" + path).c_str(), &st), 0);
    EXPECT_GE(uint64_t(st.st_blocks) * 512, shm::kSlotAlign + h->slot_bytes);
    const long pages = static_cast<long>(h->slot_bytes / 4096);
    EXPECT_EQ(PresentPages(mapping + shm::kSlotAlign, h->slot_bytes),
              small ? 0 : pages);
  });
}

// The prefaulter waits while the load reads (prefaulter.h): the arena's
// other slots are not zeroed beside the transfer a restore waits for, and
// are readied after it.
TEST_F(ObjectTierLoadTest, OtherSlotsOfAnArenaForALoadWaitForTheLoad) {
  const std::string path = "/" + prefix_ + ".tier.r0";
  SaveUploadAndLoseAllButTheObject(path);
  if (HasFatalFailure()) return;
  RestoreHeld("/dev/shm" + path, [&](char* mapping) {
    const auto* h = reinterpret_cast<const shm::ArenaHeader*>(mapping);
    ASSERT_GE(h->num_slots, 2u);
    for (uint32_t s = 1; s < h->num_slots; ++s)
      EXPECT_EQ(ResidentPages(mapping + shm::kSlotAlign + s * h->slot_bytes,
                              h->slot_bytes),
                0)
          << "slot " << s << " readied beside the load";
  });
}

}  // namespace
}  // namespace ckpt::testing
