#include "shm/segment_access.h"

#include <acl/libacl.h>
#include <sys/acl.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status.h"

namespace ckpt::shm {
namespace {

struct AclFree {
  void operator()(acl_t acl) const { acl_free(acl); }
};
using AclPtr = std::unique_ptr<std::remove_pointer_t<acl_t>, AclFree>;

// One entry; a qualifier only for ACL_USER.
bool AddEntry(acl_t* acl, acl_tag_t tag, bool read_write, const uid_t* uid) {
  acl_entry_t entry;
  acl_permset_t perms;
  if (acl_create_entry(acl, &entry) != 0 || acl_set_tag_type(entry, tag) != 0)
    return false;
  if (uid != nullptr && acl_set_qualifier(entry, uid) != 0) return false;
  if (acl_get_permset(entry, &perms) != 0 || acl_clear_perms(perms) != 0)
    return false;
  if (read_write && (acl_add_perm(perms, ACL_READ) != 0 ||
                     acl_add_perm(perms, ACL_WRITE) != 0))
    return false;
  return acl_set_permset(entry, perms) == 0;
}

// owner rw, user_uid rw, group and others nothing (mode 0660 with the
// mask). Null with errno set if libacl refused.
AclPtr AclGranting(uid_t user_uid) {
  acl_t raw = acl_init(5);
  if (raw == nullptr) return nullptr;
  bool ok = AddEntry(&raw, ACL_USER_OBJ, true, nullptr) &&
            AddEntry(&raw, ACL_USER, true, &user_uid) &&
            AddEntry(&raw, ACL_GROUP_OBJ, false, nullptr) &&
            AddEntry(&raw, ACL_MASK, true, nullptr) &&
            AddEntry(&raw, ACL_OTHER, false, nullptr) && acl_valid(raw) == 0;
  AclPtr acl(raw);
  if (!ok) return nullptr;
  return acl;
}

}  // namespace

absl::Status GrantSegment(int fd, const std::string& name, uid_t user_uid) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fstat"));
  const uid_t self = ::geteuid();
  if (st.st_uid != self && ::fchown(fd, self, ::getegid()) != 0)
    return ErrnoToStatus(
        errno, absl::StrCat("arena ", name, ": fchown to uid ", self));
  // Also drops an ACL a previous owner left (chmod sets the mask).
  if (::fchmod(fd, 0600) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fchmod"));
  if (user_uid == static_cast<uid_t>(-1) || user_uid == self)
    return absl::OkStatus();
  AclPtr acl = AclGranting(user_uid);
  if (acl == nullptr)
    return ErrnoToStatus(
        errno,
        absl::StrCat("arena ", name, ": build the ACL for uid ", user_uid));
  if (acl_set_fd(fd, acl.get()) == 0) return absl::OkStatus();
  if (errno != EOPNOTSUPP)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": grant uid ",
                                             user_uid, " (ACL)"));
  // No ACLs here: the job's uid owns the segment, as before ACLs were used.
  if (::fchown(fd, user_uid, static_cast<gid_t>(-1)) != 0)
    return ErrnoToStatus(
        errno, absl::StrCat("arena ", name, ": fchown to uid ", user_uid));
  return absl::OkStatus();
}

absl::Status CheckSegmentOwner(const struct stat& st, const std::string& name,
                               uid_t owner, uid_t or_owner) {
  if (st.st_uid != owner && st.st_uid != or_owner)
    return absl::PermissionDeniedError(
        absl::StrCat("arena ", name, ": the segment is owned by uid ",
                     st.st_uid, ", not by uid ", owner,
                     or_owner != owner ? absl::StrCat(" or ", or_owner) : "",
                     "; another user may have created it: refused"));
  if ((st.st_mode & S_IRWXO) != 0)
    return absl::PermissionDeniedError(absl::StrFormat(
        "arena %s: mode %04o lets every user open the segment: refused", name,
        st.st_mode & 07777));
  return absl::OkStatus();
}

}  // namespace ckpt::shm
