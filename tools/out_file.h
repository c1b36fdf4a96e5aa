// An output file of the tools, written in full, fsynced and renamed into
// place on Close ("<path>.partial.<pid>" until then); removed if destroyed
// before, so a failed restore or export never leaves a half file under the
// name asked for. Close(replace = false) never replaces a file that
// appeared at the path meanwhile (AlreadyExists). Errors name the path.
// Header-only; not thread-safe.
#ifndef CKPT_TOOLS_OUT_FILE_H_
#define CKPT_TOOLS_OUT_FILE_H_

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::tools {

[[nodiscard]] inline absl::Status WriteAll(int fd, const char* data,
                                           uint64_t len,
                                           const std::string& path) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "write " + path);
    data += n;
    len -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }

  [[nodiscard]] absl::Status Open(const std::string& path) {
    path_ = path;
    tmp_ = absl::StrCat(path, ".partial.", getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoToStatus(errno, "create " + tmp_);
    return absl::OkStatus();
  }
  [[nodiscard]] absl::Status Write(const char* data, uint64_t len) {
    return WriteAll(fd_, data, len, tmp_);
  }
  [[nodiscard]] absl::Status Close(bool replace = true) {
    absl::Status s;
    if (::fsync(fd_) != 0) s = ErrnoToStatus(errno, "fsync " + tmp_);
    ::close(fd_);
    fd_ = -1;
    if (s.ok() && ::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(),
                              replace ? 0 : RENAME_NOREPLACE) != 0)
      s = errno == EEXIST ? absl::AlreadyExistsError(absl::StrCat(
                                path_, ": exists (it appeared meanwhile)"))
                          : ErrnoToStatus(errno, "rename to " + path_);
    if (!s.ok()) ::unlink(tmp_.c_str());
    return s;
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_OUT_FILE_H_
