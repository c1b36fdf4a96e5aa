// LeaseTable: the leases that clients hold on slots. A lease names its
// holder (pid, and a pidfd to see it exit), the job, rank, slot and step it
// is for, and whether it writes (a save) or reads (a restore). Adding a
// lease for a caller that has already exited fails (Aborted): nobody could
// ever release it. DeadHolders() is the reaper's poll: the leases whose
// holder has exited, which the engine then releases.
//
// The table owns the pidfds (closed on Remove and on destruction). It knows
// nothing of slots: what a release does to the slot is the engine's (and
// RankSlots') business.
//
// Thread-safety: none of its own; it is part of the JobTable
// (job_table.h), whose lock its caller holds around every call.
#ifndef CKPT_DAEMON_CORE_LEASE_TABLE_H_
#define CKPT_DAEMON_CORE_LEASE_TABLE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::daemon {

struct Lease {
  std::string job;
  uint32_t rank = 0;
  uint32_t slot = 0;
  uint64_t step = 0;
  bool write = false;
  pid_t pid = 0;
  int pidfd = -1;  // set by LeaseTable::Add
  // A FILE restore's lease: the storage key of the shard file the client
  // reads itself (slot is then unused). Empty for a slot's lease.
  std::string file_key{};
  // A restore's read of a slot: the arena whose queued slots the
  // prefaulter holds back while the lease is open (Prefaulter::BeginRead;
  // NodeState::ReleaseLease ends it). Empty: none.
  std::string prefault_hold{};
  // A save that may drop the rank's shards of later steps (BeginSave
  // allowed the rewind); without it a commit that would is refused.
  bool rewind = false;
  // Saves: BeginSave's arrival and the slot's grant (metrics.h).
  std::chrono::steady_clock::time_point begun{}, granted{};
};

class LeaseTable {
 public:
  LeaseTable() = default;
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;
  ~LeaseTable();

  // Opens a pidfd on lease.pid (when > 0) and returns the new lease's id;
  // Aborted when that process has already exited.
  [[nodiscard]] absl::StatusOr<uint64_t> Add(Lease lease);
  // The lease `id`, or nullptr.
  const Lease* Find(uint64_t id) const;
  // The open lease `id` of (job, rank) that writes (`write`) or reads, or
  // nullptr: what CommitSave, AbortSave and CloseRestore accept.
  const Lease* FindFor(uint64_t id, const std::string& job, uint32_t rank,
                       bool write) const;
  // Removes lease `id` (closing its pidfd) and returns it; nullopt if none.
  std::optional<Lease> Remove(uint64_t id);
  // The pid holding lease `id`, 0 if none.
  pid_t HolderPid(uint64_t id) const;
  // Whether a FILE restore's lease holds `key` (with `prefix`, any key
  // under it).
  bool HoldsFile(std::string_view key, bool prefix) const;
  // Whether any lease is for `job`.
  bool AnyForJob(const std::string& job) const;
  // The leases whose holder has exited (pidfd readable, or, without a
  // pidfd, kill(pid, 0) says ESRCH). Does not block.
  std::vector<uint64_t> DeadHolders() const;

 private:
  std::map<uint64_t, Lease> leases_;
  uint64_t next_id_ = 1;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_LEASE_TABLE_H_
