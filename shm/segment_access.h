// Who may open an arena's shared-memory segment (private to shm/).
//
// The segment is the daemon's: owned by its uid, mode 0600. The job's uid
// is only granted read-write access by a POSIX ACL entry. Two reasons:
// systemd-logind's RemoveIPC deletes every /dev/shm file a user owns when
// the user's last session ends, which would take a running job's arenas
// (and its staged steps) with it; and /dev/shm is world-writable, so a
// segment found under an arena's name is trusted only if its owner is the
// daemon (or the job's uid: arenas of older daemons, and file systems
// without ACLs) and nobody else may open it.
//
// Thread-safety: plain functions on a descriptor the caller owns.
#ifndef CKPT_SHM_SEGMENT_ACCESS_H_
#define CKPT_SHM_SEGMENT_ACCESS_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace ckpt::shm {

// Makes the segment behind fd the caller's (its euid), mode 0600, and lets
// user_uid open it read-write (an ACL entry). A file system without POSIX
// ACLs (a tmpfs built without them) gets the older scheme instead: the
// segment is given to user_uid. user_uid (uid_t)-1 or the caller's euid:
// nobody else.
[[nodiscard]] absl::Status GrantSegment(int fd, const std::string& name,
                                        uid_t user_uid);

// PermissionDenied naming the owner or the mode unless st describes a
// segment owned by one of the two uids that grants others nothing.
[[nodiscard]] absl::Status CheckSegmentOwner(const struct stat& st,
                                             const std::string& name,
                                             uid_t owner, uid_t or_owner);

}  // namespace ckpt::shm

#endif  // CKPT_SHM_SEGMENT_ACCESS_H_
