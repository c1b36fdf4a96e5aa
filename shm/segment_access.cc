#include "shm/segment_access.h"

#include <endian.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status.h"

namespace ckpt::shm {
namespace {

// The kernel's POSIX ACL xattr ABI (linux/posix_acl_xattr.h: a version,
// then entries sorted by tag and id; the tag values are acl(5)'s).
constexpr uint32_t kAclVersion = 2;
constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kMask = 0x10,
                   kOther = 0x20;
constexpr uint16_t kReadWrite = 0x4 | 0x2;
constexpr uint32_t kUndefinedId = 0xffffffffu;

void PutEntry(std::vector<char>& out, uint16_t tag, uint16_t perm, uint32_t id) {
  const uint16_t t = htole16(tag), p = htole16(perm);
  const uint32_t i = htole32(id);
  const size_t at = out.size();
  out.resize(at + 8);
  std::memcpy(&out[at], &t, 2);
  std::memcpy(&out[at + 2], &p, 2);
  std::memcpy(&out[at + 4], &i, 4);
}

// owner rw, user_uid rw, group and others nothing (mode 0660 with the mask).
std::vector<char> AclGranting(uid_t user_uid) {
  std::vector<char> acl(4);
  const uint32_t v = htole32(kAclVersion);
  std::memcpy(acl.data(), &v, 4);
  PutEntry(acl, kUserObj, kReadWrite, kUndefinedId);
  PutEntry(acl, kUser, kReadWrite, user_uid);
  PutEntry(acl, kGroupObj, 0, kUndefinedId);
  PutEntry(acl, kMask, kReadWrite, kUndefinedId);
  PutEntry(acl, kOther, 0, kUndefinedId);
  return acl;
}

}  // namespace

absl::Status GrantSegment(int fd, const std::string& name, uid_t user_uid) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fstat"));
  const uid_t self = ::geteuid();
  if (st.st_uid != self && ::fchown(fd, self, ::getegid()) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fchown to uid ", self));
  // Also drops an ACL a previous owner left (chmod sets the mask).
  if (::fchmod(fd, 0600) != 0) return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fchmod"));
  if (user_uid == static_cast<uid_t>(-1) || user_uid == self) return absl::OkStatus();
  const std::vector<char> acl = AclGranting(user_uid);
  if (::fsetxattr(fd, "system.posix_acl_access", acl.data(), acl.size(), 0) == 0)
    return absl::OkStatus();
  if (errno != EOPNOTSUPP)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": grant uid ", user_uid, " (ACL)"));
  // No ACLs here: the job's uid owns the segment, as before ACLs were used.
  if (::fchown(fd, user_uid, static_cast<gid_t>(-1)) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fchown to uid ", user_uid));
  return absl::OkStatus();
}

absl::Status CheckSegmentOwner(const struct stat& st, const std::string& name, uid_t owner,
                               uid_t or_owner) {
  if (st.st_uid != owner && st.st_uid != or_owner)
    return absl::PermissionDeniedError(absl::StrCat(
        "arena ", name, ": the segment is owned by uid ", st.st_uid, ", not by uid ", owner,
        or_owner != owner ? absl::StrCat(" or ", or_owner) : "",
        "; another user may have created it: refused"));
  if ((st.st_mode & S_IRWXO) != 0)
    return absl::PermissionDeniedError(
        absl::StrFormat("arena %s: mode %04o lets every user open the segment: refused", name,
                        st.st_mode & 07777));
  return absl::OkStatus();
}

}  // namespace ckpt::shm
