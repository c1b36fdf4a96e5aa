#include "util/truncation_guard.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/strings.h"

namespace ckpt {
namespace {

enum GuardedRangeState : int {
  kRangeFree = 0,
  kRangeClaimed = 1,
  kRangeActive = 2
};

// One guarded range. Plain lock-free atomics: the signal handler reads
// them.
struct GuardedRange {
  std::atomic<int> state{kRangeFree};
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> bytes{0};
  std::atomic<int> prot{0};
  std::atomic<bool> faulted{false};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free);
static_assert(std::atomic<size_t>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);

GuardedRange g_guarded_ranges[TruncationGuard::kMaxRanges];
struct sigaction g_previous_sigbus {};
std::once_flag g_sigbus_once;
std::atomic<bool> g_sigbus_installed{false};

// A SIGBUS that is not ours: the previous handler's, or the default action.
void ChainSigbus(int sig, siginfo_t* info, void* context) {
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0 &&
      g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) == 0 &&
      g_previous_sigbus.sa_handler != SIG_DFL &&
      g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  // The default action from now on (SIGBUS from a fault cannot be ignored):
  // a fault runs its instruction again and dies of it with a core dump; a
  // SIGBUS that was sent (si_code <= 0) is sent again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(SIGBUS);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // si_code > 0: raised by the kernel for a fault at si_addr.
  if (info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (GuardedRange& r : g_guarded_ranges) {
      if (r.state.load(std::memory_order_acquire) != kRangeActive) continue;
      const uintptr_t base = r.base.load(std::memory_order_relaxed);
      const size_t bytes = r.bytes.load(std::memory_order_relaxed);
      if (addr - base >= bytes) continue;  // unsigned: below base too
      // Replaced by another thread already: this fault hit the old
      // mapping, and the instruction runs again on the new one.
      if (r.faulted.load(std::memory_order_acquire)) {
        errno = saved_errno;
        return;
      }
      void* p = ::mmap(reinterpret_cast<void*>(base), bytes,
                       r.prot.load(std::memory_order_relaxed),
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
      if (p != MAP_FAILED) {
        r.faulted.store(true, std::memory_order_release);
        errno = saved_errno;
        return;
      }
      break;  // cannot repair it: a crash, as without the guard
    }
  }
  errno = saved_errno;
  ChainSigbus(sig, info, context);
}

absl::Status InstallSigbusHandler() {
  absl::Status status;
  std::call_once(g_sigbus_once, [&status] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    // SA_NODEFER: a second fault in the handler (which would be a bug)
    // takes the default action instead of blocking forever.
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(SIGBUS, &sa, &g_previous_sigbus) != 0)
      status = ErrnoToStatus(errno, "sigaction SIGBUS");
    else
      g_sigbus_installed.store(true);
  });
  if (status.ok() && !g_sigbus_installed.load())
    return absl::InternalError("sigaction SIGBUS: not installed");
  return status;
}

}  // namespace

TruncationGuard::TruncationGuard(TruncationGuard&& other) noexcept
    : index_(std::exchange(other.index_, -1)) {}

TruncationGuard& TruncationGuard::operator=(TruncationGuard&& other) noexcept {
  if (this != &other) {
    Release();
    index_ = std::exchange(other.index_, -1);
  }
  return *this;
}

TruncationGuard::~TruncationGuard() { Release(); }

absl::Status TruncationGuard::Guard(void* base, size_t bytes, int prot,
                                    std::string_view what) {
  Release();
  CKPT_RETURN_IF_ERROR(InstallSigbusHandler());
  for (int i = 0; i < kMaxRanges; ++i) {
    GuardedRange& r = g_guarded_ranges[i];
    int expected = kRangeFree;
    if (!r.state.compare_exchange_strong(expected, kRangeClaimed,
                                         std::memory_order_acq_rel))
      continue;
    r.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
    r.bytes.store(bytes, std::memory_order_relaxed);
    r.prot.store(prot, std::memory_order_relaxed);
    r.faulted.store(false, std::memory_order_relaxed);
    r.state.store(kRangeActive, std::memory_order_release);
    index_ = i;
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(AV(what), ": more than ", kMaxRanges,
                   " shared mappings guarded against truncation"));
}

void TruncationGuard::Release() {
  if (index_ < 0) return;
  g_guarded_ranges[index_].state.store(kRangeFree, std::memory_order_release);
  index_ = -1;
}

bool TruncationGuard::faulted() const {
  return index_ >= 0 &&
         g_guarded_ranges[index_].faulted.load(std::memory_order_acquire);
}

}  // namespace ckpt
