#include "tools/restart_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

// The key=value lines of `text`: a line without '=' or a key given twice
// is an error naming it; blank lines are skipped.
absl::StatusOr<std::map<std::string, std::string>> KeyValues(
    absl::string_view text) {
  std::map<std::string, std::string> kv;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos || eq == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("line \"", line.substr(0, 64), "\": not key=value"));
    std::string key(line.substr(0, eq));
    if (!kv.emplace(key, std::string(line.substr(eq + 1))).second)
      return absl::InvalidArgumentError(absl::StrCat(key, ": given twice"));
  }
  return kv;
}

// The decimal digits of `kv[key]` as an unsigned value in [min, max]
// (no sign, no blanks, no leading '+').
absl::StatusOr<uint64_t> Unsigned(const std::map<std::string, std::string>& kv,
                                  const std::string& key, uint64_t min,
                                  uint64_t max) {
  auto it = kv.find(key);
  if (it == kv.end()) return absl::InvalidArgumentError(key + ": missing");
  const std::string& v = it->second;
  uint64_t n = 0;
  bool digits = !v.empty() && v.size() <= 20 &&
                v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || !absl::SimpleAtoi(v, &n) || n < min || n > max)
    return absl::InvalidArgumentError(absl::StrCat(key, ": \"", v.substr(0, 32),
                                                   "\" is not a number in [",
                                                   min, ", ", max, "]"));
  return n;
}

}  // namespace

std::string FormatPlan(const TrainerPlan& p) {
  std::string text = absl::StrCat(
      "generation=", p.generation, "\nrank=", p.rank,
      "\nworld_size=", p.world_size, "\nlocal_rank=", p.local_rank,
      "\nlocal_world_size=", p.local_world_size,
      "\nmaster_addr=", p.master_addr, "\nmaster_port=", p.master_port, "\n");
  if (p.restore_step)
    absl::StrAppend(&text, "restore_step=", *p.restore_step, "\n");
  return text;
}

absl::StatusOr<pid_t> ParseCapable(absl::string_view text) {
  absl::StatusOr<std::map<std::string, std::string>> kv = KeyValues(text);
  if (!kv.ok()) return kv.status();
  absl::StatusOr<uint64_t> pid = Unsigned(*kv, "pid", 1, INT_MAX);
  if (!pid.ok()) return pid.status();
  return static_cast<pid_t>(*pid);
}

absl::StatusOr<uint64_t> ParseJoined(absl::string_view text) {
  absl::StatusOr<std::map<std::string, std::string>> kv = KeyValues(text);
  if (!kv.ok()) return kv.status();
  return Unsigned(*kv, "generation", 0, UINT64_MAX);
}

absl::Status WriteFileAtomically(const std::string& dir,
                                 const std::string& name,
                                 absl::string_view text) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(),
                  O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoToStatus(errno, tmp);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoToStatus(err, tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, tmp);
  }
  // No fsync: the reader is a process on this machine, not a reboot.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, path);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          size_t limit) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path + ": not there");
    return ErrnoToStatus(errno, path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(path + ": not a regular file");
  }
  std::string text(limit + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, path);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > limit)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", limit, " bytes"));
  text.resize(got);
  return text;
}

}  // namespace ckpt::tools
