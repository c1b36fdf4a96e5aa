#include "util/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr char kLockFile[] = ".lock";

// The holder's "<program> <pid>", as it wrote it; empty when unreadable
// (it is between its lock and its write) or not of that shape.
std::string HolderOf(int fd) {
  char buf[128] = {};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  absl::StripAsciiWhitespace(&text);
  const size_t space = text.rfind(' ');
  uint32_t pid = 0;
  if (space == std::string::npos ||
      !absl::SimpleAtoi(text.substr(space + 1), &pid) || pid == 0)
    return "";
  const std::string program = text.substr(0, space);
  for (char c : program)
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return "";
  return absl::StrCat(program, " pid ", pid);
}

}  // namespace

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

absl::StatusOr<DirLock> DirLock::Acquire(const std::string& dir,
                                         const std::string& program,
                                         const std::string& field) {
  const std::string path = absl::StrCat(dir, "/", kLockFile);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": cannot open its lock file ", path, ": ", std::strerror(errno)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = err == EWOULDBLOCK ? HolderOf(fd) : "";
    close(fd);
    if (err != EWOULDBLOCK)
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": cannot lock ", path, ": ", std::strerror(err)));
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": in use by ", holder.empty() ? "another process" : holder,
        " (it holds ", path, "); stop it or give this one another ", field));
  }
  const std::string me = absl::StrCat(program, " ", getpid(), "\n");
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot write ", path, ": ", std::strerror(err)));
  }
  return DirLock(fd);
}

}  // namespace ckpt
