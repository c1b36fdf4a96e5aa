// File-system helpers of the local backend: key validation, durable
// directory creation, directory fsync, the recursive listing and the removal
// of crash leftovers. Every error is a Status naming the path. Thread-safe
// (no shared state).
#ifndef CKPT_STORAGE_LOCAL_FS_H_
#define CKPT_STORAGE_LOCAL_FS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::storage::internal {

// The marker of temporary files: "<key>.tmp.<nonce>", or with a writer's
// tag "<key>.tmp.<tag>.<nonce>" (the nonce has no '.').
inline constexpr std::string_view kTmpMarker = ".tmp.";

// The temp file name suffix for `tag` and `nonce`.
std::string TmpSuffix(std::string_view tag, std::string_view nonce);
// Whether the file `name` is a temp file of `tag` (any temp file for "").
bool IsTmpFileOf(std::string_view name, std::string_view tag);

// A key is a relative path of non-empty components, none "." or "..", and
// no component containing ".tmp.". A prefix may be empty or end in '/'.
[[nodiscard]] absl::Status ValidateKey(std::string_view key,
                                       std::string_view field = "key");
absl::Status ValidatePrefix(std::string_view prefix);

// A file descriptor, closed when it goes away.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ~ScopedFd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// The directory root/dir ("" is root itself), opened without following a
// symlink anywhere below root: the root daemon works in directories users
// may write to (a team's shared root), and a `<job>/` or `step-…` symlink
// planted there must not send its creates, chowns or unlinks into another
// job's directory. Every component is resolved with openat2(RESOLVE_BENEATH
// | RESOLVE_NO_SYMLINKS), or, on a kernel without openat2, one O_NOFOLLOW
// openat at a time. root itself is the operator's and is opened as named.
// create: missing directories are made (0755); with sync each one's parent
// is fsynced, also when another writer made it first (EEXIST), whose fsync
// may not have happened yet. A component that is a symlink or not a
// directory is FailedPrecondition naming root/dir; a missing one (create
// false) NotFound.
//
// With create, a directory is written into only when it is trusted: owned
// by root, by this process's effective uid, by root's own owner, or by
// `job_uid` (the uid the files are made for). A directory another user
// made first in a shared root would let that user rename or unlink what is
// written there; it is FailedPrecondition naming it.
[[nodiscard]] absl::StatusOr<ScopedFd> OpenDirBeneath(
    const std::string& root, std::string_view dir, bool create, bool sync,
    std::optional<uid_t> job_uid = std::nullopt);
// "a/b/c" -> {"a/b", "c"}; "c" -> {"", "c"}.
std::pair<std::string_view, std::string_view> SplitKey(std::string_view key);
// fsync(fd); the error names `what`.
[[nodiscard]] absl::Status SyncFd(int fd, const std::string& what);
// Regular files under root/dir_part (recursively), as keys relative to
// root, skipping temporary files and symlinks. root/dir_part reached
// through a symlink is FailedPrecondition; a missing one lists nothing.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListFiles(
    const std::string& root, std::string_view dir_part);
// Removes every temp file of `tag` under root (IsTmpFileOf), each unlinked
// relative to its directory opened by OpenDirBeneath.
[[nodiscard]] absl::Status RemoveTmpFiles(const std::string& root,
                                          std::string_view tag = "");
// Removes the parent directories of key, deepest first, while they are empty.
void RemoveEmptyParents(const std::string& root, std::string_view key);

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_LOCAL_FS_H_
