#include "client/restart_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "util/validate.h"

namespace ckpt::restart {

namespace {

constexpr size_t kMaxAddressBytes = 255;  // ckpt_plan.master_addr[256]

// The lines of `text` as key -> value; a line without '=' or a repeated key
// is refused naming it.
absl::StatusOr<std::map<std::string, std::string, std::less<>>> Lines(
    std::string_view text, const char* file) {
  std::map<std::string, std::string, std::less<>> out;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": line ", QuotePrefix(line), " is not key=value"));
    std::string key(line.substr(0, eq));
    if (!out.emplace(key, std::string(line.substr(eq + 1))).second)
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, " is given twice"));
  }
  return out;
}

template <typename T>
absl::Status Number(
    const std::map<std::string, std::string, std::less<>>& lines,
    const char* file, const char* key, T min, T max, T* out) {
  auto it = lines.find(key);
  if (it == lines.end())
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", key, " is missing"));
  T v{};
  if (!absl::SimpleAtoi(it->second, &v) || v < min || v > max)
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", key, ": ", QuotePrefix(it->second),
                     " is not an integer in [", min, ", ", max, "]"));
  *out = v;
  return absl::OkStatus();
}

std::string PathOf(const std::string& dir, const char* name) {
  return absl::StrCat(dir, "/", name);
}

}  // namespace

std::string FormatPlan(const RestartPlan& p) {
  std::string out = absl::StrCat(
      "generation=", p.generation, "\nrank=", p.rank,
      "\nworld_size=", p.world_size, "\nlocal_rank=", p.local_rank,
      "\nlocal_world_size=", p.local_world_size,
      "\nmaster_addr=", p.master_addr, "\nmaster_port=", p.master_port, "\n");
  if (p.restore_step)
    absl::StrAppend(&out, "restore_step=", *p.restore_step, "\n");
  return out;
}

absl::StatusOr<RestartPlan> ParsePlan(std::string_view text) {
  constexpr char kFile[] = "plan";
  auto lines = Lines(text, kFile);
  if (!lines.ok()) return lines.status();
  constexpr uint32_t kU32 = std::numeric_limits<uint32_t>::max();
  RestartPlan p;
  if (absl::Status s =
          Number<uint64_t>(*lines, kFile, "generation", 0,
                           std::numeric_limits<uint64_t>::max(), &p.generation);
      !s.ok())
    return s;
  if (absl::Status s =
          Number<uint32_t>(*lines, kFile, "world_size", 1, kU32, &p.world_size);
      !s.ok())
    return s;
  if (absl::Status s =
          Number<uint32_t>(*lines, kFile, "rank", 0, p.world_size - 1, &p.rank);
      !s.ok())
    return s;
  if (absl::Status s = Number<uint32_t>(*lines, kFile, "local_world_size", 1,
                                        p.world_size, &p.local_world_size);
      !s.ok())
    return s;
  if (absl::Status s = Number<uint32_t>(*lines, kFile, "local_rank", 0,
                                        p.local_world_size - 1, &p.local_rank);
      !s.ok())
    return s;
  if (absl::Status s = Number<uint32_t>(*lines, kFile, "master_port", 1, 65535,
                                        &p.master_port);
      !s.ok())
    return s;
  auto addr = lines->find("master_addr");
  if (addr == lines->end())
    return absl::InvalidArgumentError("plan: master_addr is missing");
  if (absl::Status s = ValidatePrintable(addr->second, "plan: master_addr",
                                         kMaxAddressBytes);
      !s.ok())
    return s;
  if (addr->second.find_first_of(" \t") != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: master_addr: ", QuotePrefix(addr->second), " has a blank"));
  p.master_addr = addr->second;
  if (lines->contains("restore_step")) {
    int64_t step = 0;
    if (absl::Status s =
            Number<int64_t>(*lines, kFile, "restore_step", 0,
                            std::numeric_limits<int64_t>::max(), &step);
        !s.ok())
      return s;
    p.restore_step = step;
  }
  return p;
}

std::string FormatCapable(int64_t pid) {
  return absl::StrCat("pid=", pid, "\n");
}

absl::StatusOr<int64_t> ParseCapable(std::string_view text) {
  auto lines = Lines(text, kCapableFile);
  if (!lines.ok()) return lines.status();
  int64_t pid = 0;
  if (absl::Status s =
          Number<int64_t>(*lines, kCapableFile, "pid", 1,
                          std::numeric_limits<int32_t>::max(), &pid);
      !s.ok())
    return s;
  return pid;
}

std::string FormatJoined(uint64_t generation) {
  return absl::StrCat("generation=", generation, "\n");
}

absl::StatusOr<uint64_t> ParseJoined(std::string_view text) {
  auto lines = Lines(text, kJoinedFile);
  if (!lines.ok()) return lines.status();
  uint64_t g = 0;
  if (absl::Status s =
          Number<uint64_t>(*lines, kJoinedFile, "generation", 0,
                           std::numeric_limits<uint64_t>::max(), &g);
      !s.ok())
    return s;
  return g;
}

absl::Status WriteFile(const std::string& dir, const char* name,
                       std::string_view text) {
  const std::string path = PathOf(dir, name);
  const std::string tmp = absl::StrCat(path, ".tmp");
  int fd = ::open(tmp.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return absl::UnavailableError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat(tmp, ": write: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat(path, ": rename: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& dir, const char* name) {
  const std::string path = PathOf(dir, name);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(path, ": absent"));
    if (errno == ELOOP)
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a symbolic link, not read"));
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string out(kMaxFileBytes + 1, '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::UnavailableError(
          absl::StrCat(path, ": read: ", std::strerror(err)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > kMaxFileBytes)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": longer than ", kMaxFileBytes, " bytes"));
  out.resize(got);
  return out;
}

}  // namespace ckpt::restart

namespace ckpt {

namespace {

absl::StatusOr<std::string> RestartDir() {
  const char* dir = std::getenv(restart::kDirVariable);
  if (dir == nullptr || *dir == '\0')
    return absl::FailedPreconditionError(
        absl::StrCat("$", restart::kDirVariable,
                     " is not set: this process was not started by ckptrun"));
  return std::string(dir);
}

}  // namespace

absl::Status EnableRestart() {
  auto dir = RestartDir();
  if (!dir.ok()) return dir.status();
  return restart::WriteFile(*dir, restart::kCapableFile,
                            restart::FormatCapable(::getpid()));
}

absl::StatusOr<std::optional<RestartPlan>> PollRestart(uint64_t after) {
  auto dir = RestartDir();
  if (!dir.ok()) return dir.status();
  auto text = restart::ReadFile(*dir, restart::kPlanFile);
  if (absl::IsNotFound(text.status())) return std::optional<RestartPlan>();
  if (!text.ok()) return text.status();
  auto plan = restart::ParsePlan(*text);
  if (!plan.ok()) return plan.status();
  if (plan->generation <= after) return std::optional<RestartPlan>();
  return std::optional<RestartPlan>(*std::move(plan));
}

absl::Status JoinedRestart(uint64_t generation) {
  auto dir = RestartDir();
  if (!dir.ok()) return dir.status();
  return restart::WriteFile(*dir, restart::kJoinedFile,
                            restart::FormatJoined(generation));
}

}  // namespace ckpt
