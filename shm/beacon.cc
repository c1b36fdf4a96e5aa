#include "shm/beacon.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shm/arena.h"
#include "shm/scoped_fd.h"
#include "shm/segment_access.h"
#include "util/status.h"

namespace ckpt::shm {
namespace {

constexpr uint64_t kMaxComputeNs = 3600ull * 1000 * 1000 * 1000;  // an hour
constexpr int kReadTries = 4;

// An arena on hugetlbfs is named by its path (arena.h).
std::string ShmPath(std::string_view name) {
  if (name.find('/', 1) != std::string_view::npos) return std::string(name);
  return absl::StrCat("/dev/shm", absl::string_view(name.data(), name.size()));
}

// hugetlbfs maps whole 2 MiB pages from 2 MiB offsets only: there the
// beacon is reached through a mapping of the arena's first 2 MiB (the
// header's page, which the daemon never trusts: arena.h), elsewhere
// through a mapping of its own page.
bool BeaconOnHugetlbfs(int fd) {
  struct statfs fs {};
  return ::fstatfs(fd, &fs) == 0 &&
         static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC;
}

}  // namespace

std::optional<BeaconSnapshot> ReadBeacon(const BeaconPage& page) {
  for (int i = 0; i < kReadTries; ++i) {
    const uint64_t before = page.seq.load(std::memory_order_acquire);
    if (before % 2 != 0) continue;
    BeaconSnapshot snap;
    snap.step = page.step.load(std::memory_order_relaxed);
    snap.progress_count = page.progress_count.load(std::memory_order_relaxed);
    snap.compute_ns = page.compute_ns.load(std::memory_order_relaxed);
    snap.pause_count = page.pause_count.load(std::memory_order_relaxed);
    snap.pause_ms = page.pause_ms.load(std::memory_order_relaxed);
    snap.pid = page.pid.load(std::memory_order_relaxed);
    char reason[kPauseReasonWords * 8];
    for (size_t w = 0; w < kPauseReasonWords; ++w) {
      uint64_t v = page.pause_reason[w].load(std::memory_order_relaxed);
      std::memcpy(reason + w * 8, &v, 8);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (page.seq.load(std::memory_order_relaxed) != before) continue;
    if (snap.progress_count == 0 && snap.pause_count == 0) return std::nullopt;
    if (snap.step < 0 || snap.compute_ns > kMaxComputeNs ||
        snap.pause_ms > kMaxPauseMs)
      return std::nullopt;
    size_t n = ::strnlen(reason, sizeof(reason) - 1);
    for (size_t c = 0; c < n; ++c) {
      unsigned char ch = static_cast<unsigned char>(reason[c]);
      snap.pause_reason.push_back(ch >= 0x20 && ch < 0x7f ? reason[c] : '?');
    }
    return snap;
  }
  return std::nullopt;
}

BeaconView::~BeaconView() {
  guard_.Release();
  if (map_ != nullptr) ::munmap(const_cast<char*>(map_), map_bytes_);
}

absl::StatusOr<std::unique_ptr<BeaconView>> BeaconView::Open(
    std::string_view name, std::string_view job, uint32_t rank) {
  const std::string path = ShmPath(name);
  ScopedFd fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd.fd < 0) return ErrnoToStatus(errno, absl::StrCat("beacon ", path));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("beacon ", path, ": fstat"));
  const uint64_t bytes = BeaconOnHugetlbfs(fd.fd)
                             ? kSlotAlign
                             : kBeaconOffset + sizeof(BeaconPage);
  if (static_cast<uint64_t>(st.st_size) < Arena::SlotsOffset())
    return absl::DataLossError(absl::StrCat("beacon ", path, ": segment size ",
                                            st.st_size, " is too small"));
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED)
    return ErrnoToStatus(errno, absl::StrCat("beacon ", path, ": mmap"));
  std::unique_ptr<BeaconView> view(new BeaconView());
  view->name_ = std::string(name);
  view->map_ = static_cast<const char*>(p);
  view->map_bytes_ = bytes;
  view->dev_ = st.st_dev;
  view->ino_ = st.st_ino;
  CKPT_RETURN_IF_ERROR(
      view->guard_.Guard(p, bytes, PROT_READ, absl::StrCat("beacon ", path)));
  const auto* h = reinterpret_cast<const ArenaHeader*>(view->map_);
  if (h->magic != kArenaMagic || h->version != kArenaVersion)
    return absl::DataLossError(
        absl::StrCat("beacon ", path, ": header magic/version"));
  if (::strnlen(h->job, sizeof(h->job)) == sizeof(h->job) ||
      std::string_view(h->job) != job)
    return absl::DataLossError(absl::StrCat("beacon ", path, ": header job"));
  if (h->rank != rank)
    return absl::DataLossError(absl::StrCat("beacon ", path, ": header rank ",
                                            h->rank, ", expected ", rank));
  return view;
}

bool BeaconView::IsCurrent() const {
  struct stat st {};
  if (::stat(ShmPath(name_).c_str(), &st) != 0) return false;
  return static_cast<uint64_t>(st.st_dev) == dev_ &&
         static_cast<uint64_t>(st.st_ino) == ino_;
}

std::optional<BeaconSnapshot> BeaconView::Read() const {
  return ReadBeacon(*reinterpret_cast<const BeaconPage*>(map_ + kBeaconOffset));
}

std::optional<uint64_t> BeaconView::NewestSlotStep() const {
  const auto* h = reinterpret_cast<const ArenaHeader*>(map_);
  std::optional<uint64_t> newest;
  const uint32_t n = std::min(h->num_slots, kMaxSlots);
  for (uint32_t i = 0; i < n; ++i) {
    auto state = static_cast<SlotState>(
        h->slots[i].state.load(std::memory_order_acquire));
    if (state != SlotState::kStaged && state != SlotState::kPersisting &&
        state != SlotState::kDurable)
      continue;
    uint64_t step = h->slots[i].step.load(std::memory_order_relaxed);
    if (!newest || step > *newest) newest = step;
  }
  return newest;
}

BeaconWriter::~BeaconWriter() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

absl::StatusOr<std::unique_ptr<BeaconWriter>> BeaconWriter::Open(
    std::string_view name) {
  const std::string path = ShmPath(name);
  ScopedFd fd;
  fd.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd.fd < 0) return ErrnoToStatus(errno, absl::StrCat("beacon ", path));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("beacon ", path, ": fstat"));
  CKPT_RETURN_IF_ERROR(CheckSegmentOwner(st, path, 0, ::geteuid()));
  if (static_cast<uint64_t>(st.st_size) < Arena::SlotsOffset())
    return absl::DataLossError(absl::StrCat("beacon ", path, ": segment size ",
                                            st.st_size, " is too small"));
  const bool huge = BeaconOnHugetlbfs(fd.fd);
  const uint64_t bytes = huge ? kSlotAlign : sizeof(BeaconPage);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd,
                   huge ? 0 : kBeaconOffset);
  if (p == MAP_FAILED)
    return ErrnoToStatus(errno, absl::StrCat("beacon ", path, ": mmap"));
  std::unique_ptr<BeaconWriter> w(new BeaconWriter());
  w->name_ = std::string(name);
  w->map_ = static_cast<char*>(p);
  w->map_bytes_ = bytes;
  w->page_ =
      reinterpret_cast<BeaconPage*>(w->map_ + (huge ? kBeaconOffset : 0));
  // A previous trainer killed in the middle of a write left `seq` odd.
  uint64_t seq = w->page_->seq.load(std::memory_order_relaxed);
  if (seq % 2 != 0) w->page_->seq.store(seq + 1, std::memory_order_release);
  // Counters go on from the previous trainer's: a reader sees a change.
  w->count_ = w->page_->progress_count.load(std::memory_order_relaxed);
  w->pauses_ = w->page_->pause_count.load(std::memory_order_relaxed);
  w->page_->pid.store(static_cast<uint32_t>(::getpid()),
                      std::memory_order_relaxed);
  return w;
}

void BeaconWriter::ExpectPause(uint64_t pause_ms, std::string_view reason) {
  char buf[kPauseReasonWords * 8] = {};
  std::memcpy(buf, reason.data(),
              std::min(reason.size(), kMaxPauseReasonBytes));
  const uint64_t s = page_->seq.load(std::memory_order_relaxed);
  page_->seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  page_->pause_ms.store(std::min(pause_ms, kMaxPauseMs),
                        std::memory_order_relaxed);
  for (size_t w = 0; w < kPauseReasonWords; ++w) {
    uint64_t v;
    std::memcpy(&v, buf + w * 8, 8);
    page_->pause_reason[w].store(v, std::memory_order_relaxed);
  }
  page_->pause_count.store(++pauses_, std::memory_order_relaxed);
  page_->seq.store(s + 2, std::memory_order_release);
}

}  // namespace ckpt::shm
