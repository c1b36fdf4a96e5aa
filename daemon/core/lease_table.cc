// The lease table. See lease_table.h.
#include "daemon/core/lease_table.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

LeaseTable::~LeaseTable() {
  for (auto& [id, lease] : leases_)
    if (lease.pidfd >= 0) close(lease.pidfd);
}

absl::StatusOr<uint64_t> LeaseTable::Add(Lease lease) {
  lease.pidfd = -1;
  if (lease.pid > 0) {
    lease.pidfd = static_cast<int>(syscall(SYS_pidfd_open, lease.pid, 0));
    // A request can arrive after its caller died and was reaped: a lease it
    // could never release must not be handed out.
    if (lease.pidfd < 0 && errno == ESRCH)
      return absl::AbortedError(
          absl::StrCat("the calling process ", lease.pid, " has exited"));
  }
  uint64_t id = next_id_++;
  leases_.emplace(id, std::move(lease));
  return id;
}

const Lease* LeaseTable::Find(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

const Lease* LeaseTable::FindFor(uint64_t id, const std::string& job,
                                 uint32_t rank, bool write) const {
  const Lease* lease = Find(id);
  if (lease == nullptr || lease->write != write || lease->job != job ||
      lease->rank != rank)
    return nullptr;
  return lease;
}

std::optional<Lease> LeaseTable::Remove(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  Lease lease = std::move(it->second);
  leases_.erase(it);
  if (lease.pidfd >= 0) close(lease.pidfd);
  lease.pidfd = -1;
  return lease;
}

pid_t LeaseTable::HolderPid(uint64_t id) const {
  const Lease* lease = Find(id);
  return lease == nullptr ? 0 : lease->pid;
}

bool LeaseTable::HoldsFile(std::string_view key, bool prefix) const {
  for (const auto& [id, lease] : leases_) {
    if (lease.file_key.empty()) continue;
    if (prefix ? std::string_view(lease.file_key).starts_with(key)
               : lease.file_key == key)
      return true;
  }
  return false;
}

bool LeaseTable::AnyForJob(const std::string& job) const {
  for (const auto& [id, lease] : leases_)
    if (lease.job == job) return true;
  return false;
}

std::vector<uint64_t> LeaseTable::DeadHolders() const {
  std::vector<uint64_t> dead;
  for (const auto& [id, lease] : leases_) {
    if (lease.pidfd >= 0) {
      pollfd p{lease.pidfd, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) dead.push_back(id);
    } else if (lease.pid > 0 && kill(lease.pid, 0) != 0 && errno == ESRCH) {
      dead.push_back(id);  // no pidfd (out of descriptors, old kernel)
    }
  }
  return dead;
}

}  // namespace ckpt::daemon
